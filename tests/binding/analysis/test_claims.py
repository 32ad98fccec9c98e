"""The paper comparison from claims.yaml and the depth-collapse rule
(repdiag.binding.analysis.claims)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from repdiag.binding.analysis.aggregate import aggregate
from repdiag.binding.analysis.claims import (
    add_correlation_claims,
    collapse_layer,
    paper_comparison,
)
from repdiag.binding.analysis.statistics import statistics_tables
from repdiag.core.errors import StoreError
from tests.binding.stats_fakes import SETTINGS, depth_profile, model_paths


def test_paper_comparison_collapse_layer(fake_run):
    root, models, _ = fake_run
    result = aggregate(models, *model_paths(root, models), SETTINGS)
    depth = result.depth.copy()
    mask = (depth.model == "m04") & (depth.formula == "pr") & (depth.probe_set == "binding")
    depth.loc[mask, "jer_mean"] = [20.0, 21.0, 8.0, 7.5, 7.0]  # collapse entering block02
    depth.loc[mask, "drop_ci_low"] = [np.nan, -2.0, 11.0, 0.1, 0.1]
    depth.loc[mask, "drop_ci_high"] = [np.nan, 0.5, 15.0, 0.9, 0.9]
    tables = statistics_tables(result.models, depth, SETTINGS)
    comparison = paper_comparison(result.models, tables, SETTINGS, depth=depth).set_index("claim")
    assert (
        "m04: block02 (depth 0.50, -62%, drop 95% CI [11, 15])"
        in comparison.loc["depth of JER collapse, CLIP/DINOv2", "run_text"]
    )
    depth.loc[mask, "drop_ci_low"] = [np.nan, -2.0, -1.0, 0.1, 0.1]  # the drop is not real
    comparison = paper_comparison(result.models, tables, SETTINGS, depth=depth).set_index("claim")
    assert "m04: no collapse" in comparison.loc["depth of JER collapse, CLIP/DINOv2", "run_text"]
    with pytest.raises(StoreError, match="rerun aggregate_models"):
        paper_comparison(result.models, tables, SETTINGS, depth=depth.drop(columns="drop_ci_low"))


def test_collapse_rule_flat_noisy_profile_is_no_collapse():
    rng = np.random.default_rng(1)
    assert collapse_layer(depth_profile(20.0 + rng.normal(0, 1.0, size=(6, 30)))) is None


def test_collapse_rule_a_real_but_small_drop_is_no_collapse():
    rng = np.random.default_rng(2)
    levels = np.array([20.0, 20.0, 18.0, 18.0])[:, None]  # -10%: above noise, below 20%
    profile = depth_profile(levels + rng.normal(0, 0.05, size=(4, 30)))
    assert profile["drop_ci_low"].iloc[2] > 0  # the interval excludes 0 ...
    assert collapse_layer(profile) is None  # ... but the drop is under the threshold
    assert collapse_layer(profile, threshold=0.05).layer == "block02"


def test_collapse_rule_a_large_tight_drop_is_named():
    rng = np.random.default_rng(3)
    levels = np.array([20.0, 21.0, 12.6, 12.0, 11.8])[:, None]  # -40% entering block02
    found = collapse_layer(depth_profile(levels + rng.normal(0, 0.3, size=(5, 20))))
    assert found is not None and found.layer == "block02"
    assert found.relative_depth == 0.5 and found.relative_drop == pytest.approx(0.4, abs=0.02)
    assert 0 < found.drop_ci_low < found.drop_mean < found.drop_ci_high
    assert found.text("m", 0.9).startswith("m: block02 (depth 0.50, -40%, drop 90% CI [")


def test_collapse_rule_a_large_mean_drop_carried_by_few_images_is_no_collapse():
    before = np.array([60.0, 1.0, 50.0, 2.0, 40.0, 3.0])
    after = np.array([1.0, 30.0, 2.0, 25.0, 3.0, 33.0])  # mean 26 -> 15.7: -40%
    profile = depth_profile(np.stack([before, before, after]))
    assert (before.mean() - after.mean()) / before.mean() > 0.39
    assert profile["drop_ci_low"].iloc[2] < 0 < profile["drop_ci_high"].iloc[2]
    assert collapse_layer(profile) is None
    # Beside a real drop elsewhere, the noisy one is passed over even though it is larger.
    rng = np.random.default_rng(4)
    tight = np.array([30.0, 27.0])[:, None] + rng.normal(0, 0.01, size=(2, 6))
    tight = np.vstack([tight, tight[-1:] * 0.7])  # a real -30% drop entering block02
    mixed = np.vstack(
        [tight, tight[-1] * before / before.mean(), tight[-1] * after / before.mean()]
    )
    found = collapse_layer(depth_profile(mixed))
    assert found is not None and found.layer == "block02"


def test_the_correlation_claims_note_the_permutation_p_up_to_ten_units():
    corr = pd.DataFrame(
        {
            "models": ["trained", "trained"],
            "metric": ["jer", "g_iso"],
            "pearson_r": [0.9, 0.2],
            "pearson_p": [0.002, 0.6],
            "pearson_p_exact": [2 / 120, np.nan],  # 5 units; 12 units: none
            "n": [5, 12],
            "n_runs": [10, 24],
            "note": ["", ""],
            "n_permutations": [100_000, 100_000],
        }
    )
    added = {}

    def add(claim, value, text, n, note):
        added[claim] = (value, text, n, note)

    add_correlation_claims(add, corr, "jer", "r", "p")
    assert added["p"][:2] == (0.002, "p = 0.002")  # the claim stays the t p
    assert added["p"][3].endswith("Permutation p of r = 0.017.")
    add_correlation_claims(add, corr, "g_iso", "r", "p")
    assert "Permutation" not in added["p"][3]


def test_with_the_win_rate_headline_the_paper_comparison_reads_accuracy(fake_run):
    """The paper's r(JER, binding) and family means are accuracies: with the win rate as the
    headline score they are computed again on accuracy, equal to an independent Pearson r."""
    from dataclasses import replace

    from repdiag.binding.analysis.statistics import family_means
    from repdiag.common.statistics import pearson

    root, models, _ = fake_run
    win = replace(SETTINGS, binding_score="win_rate")
    result = aggregate(models, *model_paths(root, models), win)
    tables = statistics_tables(result.models, result.depth, win)
    comparison = tables["paper_comparison"].set_index("claim_id")
    means = family_means(result.models)
    accuracy_r = pearson(means["jer"], means[f"binding_{win.readout}"])[0]
    win_r = pearson(means["jer"], means[f"binding_{win.readout}_win"])[0]
    assert comparison.loc["jer_binding_r", "run_value"] == pytest.approx(accuracy_r)
    assert abs(accuracy_r - win_r) > 1e-3
    headline = tables["correlations"].set_index("metric").loc["jer", "pearson_r"]
    assert np.ravel(headline)[0] == pytest.approx(win_r)
    decorrelation = means.loc[means["family"] == "variance_decorrelation", f"binding_{win.readout}"]
    assert len(decorrelation) and abs(decorrelation.mean() - 0.5) > 0.05  # not a win rate
    assert comparison.loc["binding_variance_decorrelation", "run_value"] == pytest.approx(
        decorrelation.mean()
    )

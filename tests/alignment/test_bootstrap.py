"""Bootstrap draws of the alignment metrics: each draw is the metric recomputed on the resampled
rows, the unit resample gives the point value, and the seed mean's interval pools the seeds'
draws (repdiag.alignment.bootstrap)."""

from __future__ import annotations

import numpy as np
import pytest

from repdiag.alignment.bootstrap import (
    INTERVAL_METRICS,
    agreement_draws,
    correlation_draws,
    intervals,
    mean_draws,
    mean_intervals,
    metric_draws,
    r2_draws,
)
from repdiag.alignment.metrics import active_jaccard, code_correlation, l0, mean_cosine, r2_score
from repdiag.common.intervals import bootstrap_counts


def _arrays(n=60, seed=0):
    rng = np.random.default_rng(seed)
    x = [rng.standard_normal((n, 4)), rng.standard_normal((n, 5))]
    codes = [np.maximum(rng.standard_normal((n, 6)), 0) for _ in range(2)]
    codes[1][:, :3] = codes[0][:, :3] * 2  # half the latents agree
    codes[0][:, 5] = 0.0  # a dead latent
    recon = [xi + 0.3 * rng.standard_normal(xi.shape) for xi in x]
    translated = {(0, 1): x[1] + rng.standard_normal(x[1].shape), (1, 0): 0.5 * x[0]}
    cycled = {(0, 1): 0.9 * x[0], (1, 0): x[1] + 0.1}
    return x, codes, recon, translated, cycled


def _resampled(counts_row):
    return np.repeat(np.arange(len(counts_row)), counts_row.astype(int))


def test_each_draw_is_the_metric_on_the_resampled_rows():
    x, codes, recon, translated, cycled = _arrays()
    counts = bootstrap_counts(60, 5, seed=2)
    for b in range(5):
        rows = _resampled(counts[b])
        w = counts[b : b + 1]
        assert r2_draws(w, x[1], translated[(0, 1)])[0] == pytest.approx(
            r2_score(x[1][rows], translated[(0, 1)][rows]), rel=1e-9
        )
        assert mean_draws(w, np.count_nonzero(codes[0], axis=1))[0] == pytest.approx(
            l0(codes[0][rows])
        )
        weighted, unweighted = correlation_draws(w, codes[0], codes[1])
        assert weighted[0] == pytest.approx(code_correlation(codes[0][rows], codes[1][rows]))
        assert unweighted[0] == pytest.approx(
            code_correlation(codes[0][rows], codes[1][rows], weighted=False)
        )
        draws = metric_draws(w, x, codes, recon, translated, cycled)
        assert draws["jaccard"][0] == pytest.approx(active_jaccard(codes[0][rows], codes[1][rows]))
        cosine = np.mean([mean_cosine(translated[d][rows], x[d[1]][rows]) for d in translated])
        assert draws["tr_cosine"][0] == pytest.approx(cosine)


def test_the_unit_resample_gives_the_point_values_and_agreements_pool_rows():
    x, codes, recon, translated, cycled = _arrays()
    ones = np.ones((1, 60))
    error, total = np.arange(60.0), np.full(60, 100.0)
    parts = {"tr_intervention": (error, total), "not_a_metric": (error, total)}
    draws = metric_draws(ones, x, codes, recon, translated, cycled, parts)
    assert set(draws) == set(INTERVAL_METRICS) - {
        "cont_intervention",
        "tr_intervention_probe",
        "tr_intervention_input",
        "tr_latent_ablation",
    }
    assert draws["tr_intervention"][0] == pytest.approx(1 - error.sum() / total.sum())
    ev = np.mean([r2_score(x[i], recon[i]) for i in range(2)])
    assert draws["explained_variance"][0] == pytest.approx(ev)
    cycle = np.mean([r2_score(x[0], cycled[(0, 1)]), r2_score(x[1], cycled[(1, 0)])])
    assert draws["cycle_r2"][0] == pytest.approx(cycle)
    # rows with nothing scored (total 0) only dilute nothing; a resample of only them is NaN
    assert np.isnan(agreement_draws(np.eye(2), np.zeros(2), np.zeros(2))).all()


def test_intervals_and_the_interval_of_the_mean_over_seeds():
    rng = np.random.default_rng(0)
    seeds = [{"jaccard": rng.normal(mu, 0.1, 4000)} for mu in (0.2, 0.4)]
    single = intervals(seeds[0], 0.95)["jaccard"]
    assert single == pytest.approx([0.2 - 0.196, 0.2 + 0.196], abs=0.01)
    pooled = mean_intervals(seeds, 0.95)["jaccard"]
    # the mean of two independent draws: centre 0.3, sd 0.1 / sqrt(2)
    assert pooled == pytest.approx([0.3 - 0.196 / 2**0.5, 0.3 + 0.196 / 2**0.5], abs=0.01)
    assert intervals({"tr_r2": np.full(3, np.nan)}, 0.95)["tr_r2"] == [None, None]
    assert set(intervals({}, 0.95)) == set(INTERVAL_METRICS)  # every metric, None if undefined
    # only metrics every seed has
    assert mean_intervals([{"jaccard": np.ones(3)}, {}], 0.95)["jaccard"] == [None, None]

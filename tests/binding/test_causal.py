"""The JER intervention's analysis: manipulation check, effects with intervals, the summary."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from repdiag.binding.causal import (
    causal_correlations,
    causal_effects,
    causal_figure,
    causal_markdown,
    final_jer_by_image,
    paired_delta,
)
from repdiag.binding.stats_options import StatsSettings
from repdiag.common.intervals import mean_interval, newcombe_interval
from repdiag.core.errors import StoreError
from repdiag.core.store import open_store
from tests.binding.stats_fakes import fake_jacobian_store

IMAGES = [f"query/q{i:05d}" for i in range(8)]
SETTINGS = StatsSettings(n_bootstrap=200)


def jer_series(values) -> pd.Series:
    return pd.Series(np.asarray(values, float), index=IMAGES[: len(values)])


def models_table(rows: dict[str, tuple[str, float, float, float]]) -> pd.DataFrame:
    """model -> (family, binding, same_different, seed) on 200 queries and 100 pairs."""
    return pd.DataFrame(
        [
            {
                "model": key,
                "family": family,
                "binding_cosine": binding,
                "binding": binding,
                "same_different": same,
                "seed": seed,
                "n_queries": 200.0,
                "n_pairs": 100.0,
            }
            for key, (family, binding, same, seed) in rows.items()
        ]
    )


BASE = np.array([20.0, 21.0, 19.5, 22.0, 20.5, 21.5, 19.0, 20.0])
WOBBLE = np.array([0.3, -0.2, 0.1, -0.3, 0.2, -0.1, 0.25, -0.25])


@pytest.fixture
def effects() -> pd.DataFrame:
    table = models_table(
        {
            "base": ("contrastive", 0.125, 0.60, 0),
            "up": ("jer_intervention", 0.30, 0.62, 0),
            "down": ("jer_intervention", 0.125, 0.50, 0),
            "null": ("jer_intervention", 0.13, 0.61, 0),
        }
    )
    jer = {
        "base": jer_series(BASE),
        "up": jer_series(BASE + 4 + WOBBLE),  # raised: the ceiling of the check
        "down": jer_series(BASE - 6 + WOBBLE),
        "null": jer_series(BASE + WOBBLE),  # pushed but unmoved: the floor
    }
    pairs = {"up": "base", "down": "base", "null": "base"}
    weights = {"up": 0.05, "down": -0.05, "null": 0.01}
    regularisers = {
        key: {"weight": w, "estimate_first": 20.0, "estimate_last_mean": 25.0}
        for key, w in weights.items()
    }
    return causal_effects(table, jer, pairs, regularisers, SETTINGS).set_index("model")


def test_paired_delta_is_the_t_interval_of_the_per_image_differences() -> None:
    treated, base = jer_series(BASE + 2 + WOBBLE), jer_series(BASE)
    mean, low, high, n = paired_delta(treated, base, 0.95)
    expected = mean_interval(2 + WOBBLE, 0.95)
    assert (mean, low, high) == pytest.approx((expected[0], expected[2], expected[3]))
    assert n == 8 and mean == pytest.approx(2.0)
    # pairing by image id: the order of the index does not matter
    assert paired_delta(treated[::-1], base, 0.95)[:3] == pytest.approx((mean, low, high))


def test_paired_delta_needs_shared_images() -> None:
    with pytest.raises(StoreError, match="share 1 probe images"):
        paired_delta(jer_series([1.0, 2.0]), pd.Series([1.0], index=IMAGES[:1]), 0.95)


def test_the_manipulation_check_holds_only_when_the_interval_is_on_the_side_pushed(
    effects,
) -> None:
    assert effects.loc["up", "jer_delta"] == pytest.approx(4.0)
    assert effects.loc["down", "jer_delta"] == pytest.approx(-6.0)
    assert effects.loc["up", "manipulated"] and effects.loc["down", "manipulated"]
    assert not effects.loc["null", "manipulated"]  # the interval straddles 0
    assert effects.loc["null", "jer_delta_ci_low"] < 0 < effects.loc["null", "jer_delta_ci_high"]
    assert (effects["objective"] == "contrastive").all()


def test_a_jer_moved_against_the_weight_does_not_pass_the_check() -> None:
    table = models_table({"b": ("supervised", 0.2, 0.6, 0), "t": ("jer_intervention", 0.2, 0.6, 0)})
    jer = {"b": jer_series(BASE), "t": jer_series(BASE - 3 + WOBBLE)}
    regulariser = {"t": {"weight": 0.05, "estimate_first": 1.0, "estimate_last_mean": 1.0}}
    row = causal_effects(table, jer, {"t": "b"}, regulariser, SETTINGS).iloc[0]
    assert row["jer_delta"] == pytest.approx(-3.0) and not row["manipulated"]


def test_accuracy_changes_carry_newcombe_intervals(effects) -> None:
    up = effects.loc["up"]
    assert up["binding_cosine_delta"] == pytest.approx(0.30 - 0.125)
    expected = newcombe_interval(0.30 * 200, 200, 0.125 * 200, 200)
    assert (up["binding_cosine_delta_ci_low"], up["binding_cosine_delta_ci_high"]) == (
        pytest.approx(expected)
    )
    assert up["binding_changed"] and not effects.loc["down", "binding_changed"]
    down = effects.loc["down"]
    assert down["same_different_delta"] == pytest.approx(-0.10)
    assert down["same_different_delta_ci_high"] < 0.05  # 100 pairs: wide, but one-sided here


def test_correlations_pool_each_objective_with_its_baselines() -> None:
    rows = {"b0": ("contrastive", 0.10, 0.6, 0), "b1": ("contrastive", 0.12, 0.6, 1)}
    pairs = {}
    for i in range(4):
        rows[f"t{i}"] = ("jer_intervention", 0.10 + 0.02 * i, 0.6, i % 2)
        pairs[f"t{i}"] = f"b{i % 2}"
    table = models_table(rows)
    table["jer"] = [12.0, 13.0, 10.0, 14.0, 18.0, 22.0]
    corr = causal_correlations(table, pairs, SETTINGS)
    binding = corr[corr["target"] == "binding"].iloc[0]
    assert binding["objective"] == "contrastive" and binding["n"] == 6
    expected = np.corrcoef(table["jer"], table["binding"])[0, 1]
    assert binding["pearson_r"] == pytest.approx(expected)
    same = corr[corr["target"] == "same_different"].iloc[0]
    assert np.isnan(same["pearson_r"]) and "constant" in same["note"]


def test_summary_states_the_counts_and_every_run(effects) -> None:
    text = causal_markdown(effects.reset_index(), pd.DataFrame(), SETTINGS)
    assert "in 2 of 3 runs" in text and "changed with its interval excluding 0 in 1 of 3" in text
    for model in ("up", "down", "null"):
        assert f"| {model} |" in text
    assert "No comparisons" in causal_markdown(effects.iloc[0:0], pd.DataFrame(), SETTINGS)


def test_figure_has_its_three_labelled_panels(effects) -> None:
    table = models_table(
        {
            "base": ("contrastive", 0.125, 0.6, 0),
            "up": ("jer_intervention", 0.3, 0.6, 0),
            "down": ("jer_intervention", 0.125, 0.5, 0),
            "null": ("jer_intervention", 0.13, 0.6, 0),
        }
    )
    table["jer"] = [20.0, 24.0, 14.0, 20.0]
    pairs = {"up": "base", "down": "base", "null": "base"}
    figure = causal_figure(
        effects.reset_index(), table, pairs, binding_column="binding_cosine", chance=0.125
    )
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == [
        "manipulation check",
        "effect on binding",
        "baselines and regularised runs (final layer)",
    ]
    assert all(ax.get_xlabel() and ax.get_ylabel() for ax in figure.axes)


def test_final_jer_is_read_per_image_at_the_final_layer(tmp_path) -> None:
    path = tmp_path / "m.zarr"
    fake_jacobian_store(path, 0.5, np.random.default_rng(0), n_binding=6, n_noise=3)
    series = final_jer_by_image(path, "pr", "final", "binding")
    ds = open_store(path)
    expected = ds["jer_pr"].sel(layer="final").values[:6]
    assert list(series.index) == [f"query/q{i:05d}" for i in range(6)]
    np.testing.assert_allclose(series.to_numpy(), expected)
    with pytest.raises(StoreError, match="no layer 'head'"):
        final_jer_by_image(path, "pr", "head", "binding")

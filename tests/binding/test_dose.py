"""The binding dose series: the final network of each run is the unit, seeds are blocks,
checkpoints are trajectories; the pre-registered analysis against independent computations
(repdiag.binding.dose)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.binding.dose import (
    SERIES,
    UNIT,
    dose_analysis,
    dose_correlations,
    dose_figure,
    dose_series,
    final_runs,
    trajectories,
)
from repdiag.binding.dose_report import dose_markdown
from repdiag.common.units import ReplicationError

OPTIONS = {"n_boot": 300, "seed": 0, "confidence": 0.95, "min_models": 4}
DOSES, SEEDS = (0.0, 0.1, 0.3, 1.0), (0, 1, 2)


def series_table() -> pd.DataFrame:
    """4 doses x 3 seeds of final runs (300 steps) whose JER rises with binding and whose G.PR
    does not; two checkpoints of the lambda 1, seed 0 run; the untrained control (step 0,
    seed 0) and a model of another objective (NaN dose)."""
    rng = np.random.default_rng(0)
    rows = []
    for seed in SEEDS:
        for dose in DOSES:
            binding = 0.12 + 0.6 * dose + 0.05 * seed + rng.normal(scale=0.02)
            rows.append(
                {
                    "model": f"dose_{dose:g}_s{seed}",
                    "family": "binding_dose",
                    "dose": dose,
                    "seed": float(seed),
                    "step": 300.0,
                    "binding": binding,
                    "jer": 20.0 + 4.0 * binding + rng.normal(scale=0.1) + seed,
                    "pr_full": 30.0 + 10.0 * binding + rng.normal(scale=0.5),
                    "g_pr": 0.3 + rng.normal(scale=0.05),
                    "g_iso": 1.0 + 0.5 * binding + rng.normal(scale=0.1),
                    "l_iso_k5": 0.5 + rng.normal(scale=0.02),
                    "same_different": 0.5 + 0.3 * binding,
                }
            )
    for step, binding in ((100.0, 0.3), (200.0, 0.5)):
        rows.append({**rows[3], "model": f"dose_1_s0_step{step:.0f}", "step": step})
        rows[-1]["binding"] = binding
    rows.append({**rows[0], "model": "random_resnet", "family": "control", "dose": np.nan})
    rows[-1].update(step=0.0, binding=0.125, jer=28.0)
    rows.append({**rows[0], "model": "simclr_s0", "family": "contrastive", "dose": np.nan})
    table = pd.DataFrame(rows)
    table["binding_cosine"] = table["binding"]
    table["binding_cosine_ci_low"] = table["binding"] - 0.03
    table["binding_cosine_ci_high"] = table["binding"] + 0.03
    return table


def test_the_unit_is_the_final_network_of_each_run():
    series = dose_series(series_table())
    assert len(series) == 14  # 12 runs + 2 checkpoints; the control and simclr are outside
    finals = final_runs(series)
    assert len(finals) == 12 and finals["run"].is_unique
    assert (finals["step"] == 300).all()
    assert finals.loc[finals["run"] == "lambda=1/seed=0", "model"].item() == "dose_1_s0"


def test_pooled_checkpoints_are_refused_naming_the_rows():
    with pytest.raises(ReplicationError) as err:
        dose_analysis(dose_series(series_table()), OPTIONS)
    assert "dose_1_s0_step100, dose_1_s0_step200, dose_1_s0" in str(err.value)


def per_seed_slopes(finals: pd.DataFrame, metric: str) -> list[float]:
    return [
        np.polyfit(group["binding"], group[metric], 1)[0] for _, group in finals.groupby("seed")
    ]


def enumerated_sign_flip(values) -> float:
    """Share of the 2^k sign vectors whose |mean| reaches the observed |mean|."""
    values = np.asarray(values, float)
    observed = abs(values.mean())
    means = [
        abs(np.mean(np.multiply(s, values))) for s in itertools.product((1, -1), repeat=len(values))
    ]
    return float(np.mean(np.array(means) >= observed - 1e-12))


def seed_dummies_fit(finals: pd.DataFrame, metric: str) -> tuple[float, float, int]:
    """``metric ~ binding + C(seed)`` by numpy lstsq on [binding, one dummy per seed]: the
    slope, its two-sided t p and the residual df n - seeds - 1."""
    seeds = sorted(finals["seed"].unique())
    design = np.column_stack(
        [finals["binding"], *[(finals["seed"] == s).astype(float) for s in seeds]]
    )
    y = finals[metric].to_numpy(float)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    df = len(y) - len(seeds) - 1
    se = np.sqrt(residual @ residual / df * np.linalg.inv(design.T @ design)[0, 0])
    return coef[0], 2 * sps.t.sf(abs(coef[0] / se), df), df


def test_slopes_per_seed_with_a_t_interval_over_seeds():
    table = series_table()
    frame = dose_correlations(table, OPTIONS)
    assert set(frame["models"]) == {SERIES} and set(frame["unit"]) == {UNIT}
    slopes = frame[frame["analysis"] == "slope on binding"].set_index("metric")
    assert slopes.index.tolist() == [
        "jer",
        "pr_full",
        "g_pr",
        "g_iso",
        "l_iso_k5",
        "same_different",
    ]
    finals = final_runs(dose_series(table))
    independent = per_seed_slopes(finals, "jer")
    test = sps.ttest_1samp(independent, 0.0)
    jer = slopes.loc["jer"]
    assert jer["estimate"] == pytest.approx(np.mean(independent))
    assert (jer["ci_low"], jer["ci_high"]) == pytest.approx(tuple(test.confidence_interval()))
    assert jer["p"] == pytest.approx(test.pvalue)
    assert jer["estimate"] == pytest.approx(4.0, abs=0.5)  # the generated slope
    centred = finals[["binding", "jer"]] - finals.groupby("seed")[["binding", "jer"]].transform(
        "mean"
    )
    scale = np.sqrt((centred["binding"] ** 2).sum() / (centred["jer"] ** 2).sum())
    assert jer["std_estimate"] == pytest.approx(np.mean(independent) * scale)
    r, p = sps.pearsonr(finals["binding"], finals["jer"])
    assert (jer["pearson_r"], jer["pearson_p"]) == pytest.approx((r, p))
    assert jer["pearson_ci_low"] <= r <= jer["pearson_ci_high"]
    assert jer["permutation_p_greater"] < 0.01 and jer["n_permutations"] > 1000
    # the seed fixed-effects check against least squares with seed dummies (replaces the
    # mixed model's Wald p): its t p on n - seeds - 1 = 8 degrees of freedom
    slope, p_fixed, df = seed_dummies_fit(finals, "jer")
    assert (jer["fe_slope"], jer["fe_p"], jer["fe_df"]) == pytest.approx((slope, p_fixed, 8))
    assert df == 8 and jer["fe_ci_low"] < 4.0 < jer["fe_ci_high"]
    assert not any(column.startswith("mixed") for column in frame.columns)
    # the exact sign-flip p beside the t p: three positive slopes, 2 / 2^3 whatever t says
    assert jer["p_exact"] == pytest.approx(enumerated_sign_flip(independent)) == 0.25
    g_pr = per_seed_slopes(finals, "g_pr")
    assert slopes.loc["g_pr", "p_exact"] == pytest.approx(enumerated_sign_flip(g_pr))
    columns = frame.columns.tolist()
    assert columns[columns.index("p") + 1] == "p_exact"
    assert (jer["n"], jer["n_seeds"], jer["n_doses"]) == (12, 3, 4)
    assert slopes.loc["g_pr", "permutation_p_two_sided"] > 0.05  # G.PR was drawn at random


def test_jer_against_geometry_compares_standardised_slopes_within_seed():
    table = series_table()
    frame = dose_correlations(table, OPTIONS)
    pairs = frame[frame["analysis"] == "|std slope| difference"].set_index("metric")
    assert set(pairs.index) == {
        f"{s} - {g}" for s in ("jer", "pr_full") for g in ("g_pr", "g_iso", "l_iso_k5")
    }
    finals = final_runs(dose_series(table))
    columns = ["binding", "jer", "g_iso"]
    within = finals[columns] - finals.groupby("seed")[columns].transform("mean")
    sd = np.sqrt((within**2).sum())  # ddof cancels in each ratio
    jer = np.abs(per_seed_slopes(finals, "jer")) * sd["binding"] / sd["jer"]
    iso = np.abs(per_seed_slopes(finals, "g_iso")) * sd["binding"] / sd["g_iso"]
    test = sps.ttest_1samp(jer - iso, 0.0)
    row = pairs.loc["jer - g_iso"]
    assert row["estimate"] == pytest.approx(np.mean(jer - iso))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(tuple(test.confidence_interval()))
    assert row["p"] == pytest.approx(test.pvalue) and row["n_seeds"] == 3
    assert row["p_exact"] == pytest.approx(enumerated_sign_flip(jer - iso))


def test_no_series_gives_a_table_with_a_note_not_numbers():
    frame = dose_correlations(series_table().assign(dose=np.nan), OPTIONS)
    assert (frame["n"] == 0).all() and frame["estimate"].isna().all()
    assert frame["note"].str.contains("no dose series").all()


def test_trajectories_start_from_the_untrained_control_counted_once():
    paths = trajectories(series_table())
    assert paths["model"].tolist() == [
        "random_resnet",
        "dose_1_s0_step100",
        "dose_1_s0_step200",
        "dose_1_s0",
    ]
    assert set(paths["run"]) == {"lambda=1/seed=0"}
    assert (dose_series(series_table())["model"] == "random_resnet").sum() == 0


def test_a_series_run_without_a_seed_is_refused_naming_it():
    """A run whose seed is NaN was keyed ``seed=n/a`` and merged with another run of its dose
    (one kept as the 'final' network): refused, naming the model."""
    table = series_table()
    table.loc[table["model"] == "dose_0.3_s1", "seed"] = np.nan
    named = "dose_0.3_s1 (unit 'lambda=0.3/seed=n/a', block 'nan')"
    for call in (
        lambda: dose_correlations(table, OPTIONS),
        lambda: dose_markdown(table, pd.DataFrame(), "binding_cosine", 0.95),
        lambda: final_runs(dose_series(table)),
    ):
        with pytest.raises(ReplicationError, match="the dose series: rows without a") as err:
            call()
        assert named in str(err.value) and "dose_0.3_s0" not in str(err.value)
    # handed final runs without seeds, the analysis refuses every one of them
    finals = final_runs(dose_series(series_table())).assign(seed=np.nan)
    with pytest.raises(ReplicationError, match="the dose series analysis: rows without") as err:
        dose_analysis(finals, OPTIONS)
    assert "dose_0_s0 (unit 'lambda=0/seed=0', block 'nan')" in str(err.value)


def test_figure_has_three_labelled_panels_and_draws_the_trajectories(tmp_path):
    from repdiag.common.figures import save_figure

    figure = dose_figure(series_table(), binding_column="binding_cosine", chance=0.125)
    dose_ax, jer_ax, step_ax = figure.axes[:3]
    assert dose_ax.get_xlabel().startswith("dose lambda") and dose_ax.get_xscale() == "symlog"
    assert jer_ax.get_title().startswith("final networks: r = ")
    assert jer_ax.get_title().endswith("(n = 12 runs)")
    assert step_ax.get_lines()[0].get_label() == "lambda 1, seed 0"
    assert step_ax.get_lines()[0].get_xdata().tolist() == [0.0, 100.0, 200.0, 300.0]
    png = save_figure(figure, tmp_path / "dose.png")[0]
    assert png.stat().st_size > 10_000
    empty = dose_figure(series_table().assign(dose=np.nan))
    assert "no dose series" in empty.axes[0].texts[0].get_text()


def test_one_dose_is_no_series_nothing_was_manipulated():
    """The presence runs alone (lambda = 0 on every seed, as binding_families' supervised runs
    are) give no dose analysis, no trajectories and no section, as a config without a series."""
    table = series_table()
    one_dose = table[(table["dose"] == 0.0) | table["dose"].isna()]
    assert len(dose_series(one_dose)) == 0
    frame = dose_correlations(one_dose, OPTIONS)
    assert (frame["n"] == 0).all() and frame["estimate"].isna().all()
    assert frame["note"].str.contains("two or more doses").all()
    assert len(dose_series(table[table["dose"].isin([0.0, 0.1]) | table["dose"].isna()])) == 6

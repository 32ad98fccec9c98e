"""Every table of the analysis from the models table: correlations, fits, partial correlations,
families, robustness, and controls kept out of them (repdiag.binding.analysis.statistics)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.binding.analysis.aggregate import aggregate
from repdiag.binding.analysis.statistics import family_table, ols_fits, statistics_tables
from repdiag.binding.analysis.summary import summary_markdown, zoo_curves
from repdiag.binding.analysis.units import configuration, saved_steps
from repdiag.common.claims import study_claims
from repdiag.common.exact import PERMUTATION_DRAWS, format_p, permutation_correlation_p
from repdiag.common.tables import read_table, write_csv
from repdiag.common.units import ReplicationError
from tests.binding.analysis.test_units import meta
from tests.binding.stats_fakes import FAMILIES, SETTINGS, model_paths

TOL = 1e-8


def test_statistics_tables_and_paper_comparison(fake_run, tmp_path):
    root, models, _ = fake_run
    result = aggregate(models, *model_paths(root, models), SETTINGS)
    tables = statistics_tables(result.models, result.depth, SETTINGS)
    correlations = tables["correlations"].set_index("metric")
    for metric in ("g_pr", "g_iso", "l_iso_k5", "l_iso_k10", "l_iso_k20", "jer", "same_different"):
        assert metric in correlations.index
    r = np.corrcoef(result.models["jer"], result.models["binding"])[0, 1]
    assert correlations.loc["jer", "pearson_r"] == pytest.approx(r, abs=TOL)
    assert r > 0.8  # the fabricated models bind better when their spectra are flatter
    robustness = tables["robustness"]
    assert set(robustness["target"]) == {  # both scores of every readout
        f"binding_{readout}{score}"
        for readout in ("cosine", "knn", "local_pca")
        for score in ("", "_win")
    }
    variants = set(robustness["metric"])
    assert {
        "l_iso_k5",
        "l_iso_k10",
        "l_iso_k20",
        "effective_rank",
        "participation_ratio",
    } <= variants
    assert {f"jer_{f}_{a}" for f in ("pr", "pr2", "entropy") for a in ("final", "max")} <= variants
    assert set(tables["ols"]["formula"]) >= {"binding ~ jer + same_different", "binding ~ jer"}
    # the paper's question as a contrast: JER's coefficient with G.PR in the model, and the
    # reverse, equal to least squares over the same units
    contrast = tables["ols"].query("formula == 'binding ~ jer + g_pr'").set_index("term")
    design = np.column_stack([np.ones(len(result.models)), result.models[["jer", "g_pr"]]])
    coef = np.linalg.lstsq(design, result.models["binding"].to_numpy(float), rcond=None)[0]
    assert contrast.loc[["Intercept", "jer", "g_pr"], "coef"].tolist() == pytest.approx(coef)
    assert (contrast["ci_low"] <= contrast["coef"]).all()
    assert list(tables["partial"]["controls"]) == ["same_different", "zero_shot_accuracy"]
    comparison = tables["paper_comparison"].set_index("claim")
    row = comparison.loc["Pearson r(JER, binding accuracy)"]
    assert row["paper_value"] == 0.69 and row["run_value"] == pytest.approx(r, abs=TOL)
    assert row["n_models"] == 8
    r2 = tables["ols"].query("formula == 'binding ~ jer + same_different'")["r2"].iloc[0]
    assert comparison.loc["R^2 of binding ~ JER + Same/Different (OLS)", "run_value"] == r2
    assert comparison.loc["number of models", "run_value"] == 8
    # every claim of binding/claims.yaml is evaluated, in the file's order
    assert tuple(tables["paper_comparison"]["claim_id"]) == study_claims("binding").ids
    p_row = comparison.loc["p-value of r(JER, binding accuracy)"]
    assert p_row["holds"] == (p_row["run_value"] < 0.001)  # the only banded claims: p-values
    assert comparison["holds"].notna().sum() == 2
    # Round trip through CSV, then the digest quotes the same numbers.
    for name in ("correlations", "ols", "paper_comparison"):
        write_csv(tables[name], tmp_path / f"{name}.csv")
    read_back = {
        name: read_table(tmp_path / f"{name}.csv")
        for name in ("correlations", "ols", "paper_comparison")
    }
    zoo = zoo_curves(sorted(root.glob("results/zoo/*/curve.csv")))
    text = summary_markdown(result.models, read_back, SETTINGS, zoo)
    assert f"Pearson r = {r:.3f}" in text
    assert f"R^2 = {r2:.3f}" in text
    assert "nan" not in text.lower().replace("n/a", "")
    assert "## Zoo training" in text and "obj07" in text


def test_controls_stay_out_of_the_correlations_and_fits(fake_run):
    """Models of family control are listed and reported as their own row, never fitted."""
    root, models, _ = fake_run
    result = aggregate(models, *model_paths(root, models), SETTINGS)
    table = result.models.copy()
    table.loc[table["model"].isin(["m00", "m05"]), "family"] = "control"
    tables = statistics_tables(table, result.depth, SETTINGS)
    corr = tables["correlations"]
    trained = table[table["family"] != "control"]
    jer = corr[(corr["metric"] == "jer") & (corr["models"] == "trained")].iloc[0]
    assert jer["n"] == 6
    assert jer["pearson_r"] == pytest.approx(
        np.corrcoef(trained["jer"], trained["binding"])[0, 1], abs=TOL
    )
    both = corr[(corr["metric"] == "jer") & (corr["models"] == "trained + controls")].iloc[0]
    assert both["n"] == 8
    assert both["pearson_r"] == pytest.approx(
        np.corrcoef(table["jer"], table["binding"])[0, 1], abs=TOL
    )
    assert set(tables["ols"]["n"]) == {6}
    assert "control" in set(tables["families"]["family"])
    comparison = tables["paper_comparison"].set_index("claim")
    assert comparison.loc["number of models", "run_value"] == 6
    text = summary_markdown(table, tables, SETTINGS)
    assert "6 trained models" in text and "2 controls" in text
    assert "## Controls and upper bounds (final layer" in text


def test_too_few_models_writes_tables_with_a_note(fake_run):
    root, models, _ = fake_run
    three = dict(list(models.items())[:3])
    result = aggregate(three, *model_paths(root, three), SETTINGS)
    tables = statistics_tables(result.models, result.depth, SETTINGS)
    for name in ("correlations", "ols", "partial", "robustness", "paper_comparison"):
        frame = tables[name]
        assert len(frame) > 0
        assert frame["note"].str.contains("too few models").all(), name
    assert tables["ols_summary"].startswith("NOTE: too few models")
    assert tables["correlations"]["pearson_r"].isna().all()
    assert "too few models" in summary_markdown(result.models, tables, SETTINGS)


def test_family_means_and_t_intervals():
    table = pd.DataFrame(
        {"model": list("abcd"), "family": ["x", "x", "x", "y"], "jer": [1.0, 2.0, 4.0, 3.0]}
    )
    frame = family_table(table, ["jer"], confidence=SETTINGS.confidence).set_index("family")
    values = np.array([1.0, 2.0, 4.0])
    half = sps.t.ppf(0.975, 2) * values.std(ddof=1) / math.sqrt(3)
    assert frame.loc["x", "mean"] == pytest.approx(values.mean(), abs=TOL)
    assert frame.loc["x", "ci_high"] - frame.loc["x", "mean"] == pytest.approx(half, abs=TOL)
    assert frame.loc["y", "n"] == 1 and math.isnan(frame.loc["y", "ci_low"])
    assert "no interval" in frame.loc["y", "note"]
    assert frame.loc["x", "models"] == "a;b;c"
    # the parametric p beside the interval: one-sample t against the null (0 for JER)
    assert frame.loc["x", "p"] == pytest.approx(sps.ttest_1samp(values, 0.0).pvalue)
    assert frame.loc["x", "unit"] == "model" and frame.loc["x", "null"] == 0.0
    accuracy = table.assign(same_different=[0.55, 0.6, 0.7, 0.5])
    row = (
        family_table(accuracy, ["same_different"], confidence=SETTINGS.confidence)
        .set_index("family")
        .loc["x"]
    )
    assert row["null"] == 0.5
    assert row["p"] == pytest.approx(sps.ttest_1samp([0.55, 0.6, 0.7], 0.5).pvalue)
    # beside the t p, the exact sign-flip p of the differences from the null: 0.05, 0.1, 0.2
    # all positive, so only they and their mirror reach |mean|: 2 / 2^3
    assert row["p_exact"] == pytest.approx(2 / 8)
    # JER 1, 2, 4 against 0: the same floor; and the column sits beside p
    assert frame.loc["x", "p_exact"] == pytest.approx(0.25) and math.isnan(
        frame.loc["y", "p_exact"]
    )
    columns = frame.reset_index().columns.tolist()
    assert columns[columns.index("p") + 1] == "p_exact"
    # differences of both signs, enumerated by hand: 0.6 - 0.5, 0.45 - 0.5, 0.7 - 0.5, 0.4 - 0.5
    # = (0.1, -0.05, 0.2, -0.1), sum 0.15. The 8 sign vectors starting with + give the sums
    # 0.15, 0.35, -0.25, -0.05, 0.25, 0.45, -0.15, 0.05 (signs of the last three in binary
    # order +++, ++-, +-+, +--, -++, -+-, --+, ---); six reach |0.15|, and so do their mirror
    # images: 12 of 16
    mixed = table.assign(family="x", same_different=[0.6, 0.45, 0.7, 0.4])
    row = family_table(mixed, ["same_different"], confidence=SETTINGS.confidence).iloc[0]
    assert row["p_exact"] == pytest.approx(12 / 16)


def test_each_binding_score_is_tested_against_its_own_chance():
    """Accuracy against 1 / n_candidates, a win rate against 1/2, the headline column against
    the chance of the score the settings chose (``binding_chance``)."""
    from repdiag.binding.analysis.statistics import null_value

    group = pd.DataFrame({"chance": [0.125, 0.125], "binding_chance": [0.5, 0.5]})
    assert null_value(group, "binding_cosine") == 0.125
    assert null_value(group, "binding_knn_win") == 0.5
    assert null_value(group, "binding") == 0.5
    assert null_value(group.drop(columns="binding_chance"), "binding") == 0.125


def seeded(models: pd.DataFrame) -> pd.DataFrame:
    """The fabricated models as four objectives of two seeds each (zoo runs: configuration,
    seed and steps as the models table has them), each objective in a family of its own."""
    runs = [meta(f"obj{i // 2}", i % 2) for i in range(len(models))]
    return models.assign(
        configuration=[configuration(run) for run in runs],
        seed=[float(run["seed"]) for run in runs],
        step=300.0,
        family=[FAMILIES[i // 2] for i in range(len(models))],
    )


def test_objectives_are_the_unit_of_the_family_comparison(fake_run):
    """Two seeds of each objective: every correlation, fit and claim is over the seed means
    (n = objectives), with its unit and the training runs behind it."""
    root, models, _ = fake_run
    table = seeded(aggregate(models, *model_paths(root, models), SETTINGS).models)
    means = table.assign(unit=[f"obj{i // 2}" for i in range(len(table))])
    means = means.groupby("unit")[["jer", "binding", "same_different"]].mean()
    tables = statistics_tables(table, aggregate_depth(fake_run), SETTINGS)
    rows = tables["correlations"].set_index("metric")
    r, p = sps.pearsonr(means["jer"], means["binding"])
    assert set(tables["correlations"]["models"]) == {"trained"}
    assert (rows.loc["jer", "n"], rows.loc["jer", "n_runs"]) == (4, 8)
    assert (rows.loc["jer", "pearson_r"], rows.loc["jer", "pearson_p"]) == pytest.approx((r, p))
    assert set(rows["unit"]) == {"objective (mean over its seeds)"}
    # four units: beside the t p, the permutation p of r over all 4! orders of binding
    columns = tables["correlations"].columns.tolist()
    assert columns[columns.index("pearson_p") + 1] == "pearson_p_exact"
    exact = permutation_correlation_p(means["jer"], means["binding"])
    assert rows.loc["jer", "pearson_p_exact"] == pytest.approx(exact, abs=1e-15)
    assert exact >= 1 / 24 and (rows["n_permutations"] == PERMUTATION_DRAWS).all()
    headline = summary_markdown(table, tables, SETTINGS)
    assert f"(permutation p = {format_p(exact)})" in headline
    # OLS over the four seed means against least squares by numpy
    design = np.column_stack([np.ones(4), means["jer"], means["same_different"]])
    coef, *_ = np.linalg.lstsq(design, means["binding"].to_numpy(), rcond=None)
    residual = means["binding"].to_numpy() - design @ coef
    r2 = 1 - residual @ residual / ((means["binding"] - means["binding"].mean()) ** 2).sum()
    fit = tables["ols"].query("formula == 'binding ~ jer + same_different'").set_index("term")
    assert fit.loc["jer", "coef"] == pytest.approx(coef[1])
    assert fit.loc["jer", "r2"] == pytest.approx(r2)
    assert (fit.loc["jer", "n"], fit.loc["jer", "n_runs"]) == (4, 8)
    assert tables["ols_summary"].startswith(
        "Unit: objective (mean over its seeds); n = 4 units from 8 training runs."
    )
    assert (
        set(tables["partial"]["unit"])
        == set(tables["robustness"]["unit"])
        == {"objective (mean over its seeds)"}
    )
    comparison = tables["paper_comparison"].set_index("claim_id")
    assert comparison.loc["jer_binding_r", "run_value"] == pytest.approx(r)
    assert comparison.loc["jer_binding_p", "run_value"] == pytest.approx(p)
    assert comparison.loc["jer_binding_r", "n_models"] == 4
    assert comparison.loc["jer_binding_r", "note"].startswith("unit: objective")
    assert comparison.loc["n_models", "run_text"].startswith("4 units (8 training runs)")
    # beside each n, what it could detect (repdiag.common.power at the paper's r)
    from repdiag.common.power import correlation_power

    assert rows.loc["jer", "power_at_paper_r"] == pytest.approx(correlation_power(0.69, 4))
    # the split of the slope: across the 4 objectives' means, within them across seeds
    split = tables["between_within"].set_index("metric").loc["jer"]
    line = sps.linregress(means["jer"], means["binding"])
    assert split["between"] == pytest.approx(line.slope) and split["between_df"] == 2
    assert (split["n_rows"], split["n_groups"], split["group"]) == (8, 4, "objective")
    deviations = table.assign(unit=[f"obj{i // 2}" for i in range(len(table))])
    centred = deviations[["jer", "binding"]] - deviations.groupby("unit")[
        ["jer", "binding"]
    ].transform("mean")
    within = float(centred["jer"] @ centred["binding"] / (centred["jer"] @ centred["jer"]))
    assert split["within"] == pytest.approx(within) and split["within_df"] == 8 - 4 - 1
    # a family of one objective: its interval is over that objective's two runs
    family = tables["families"].set_index(["family", "metric"]).loc[(FAMILIES[0], "jer")]
    seeds = table.loc[table["family"] == FAMILIES[0], "jer"].to_numpy(float)
    test = sps.ttest_1samp(seeds, 0.0)
    assert family["unit"] == "training run (seed) of obj0" and family["n"] == 2
    assert (family["ci_low"], family["ci_high"]) == pytest.approx(tuple(test.confidence_interval()))
    assert family["p"] == pytest.approx(test.pvalue)


def aggregate_depth(fake_run) -> pd.DataFrame:
    root, models, _ = fake_run
    return aggregate(models, *model_paths(root, models), SETTINGS).depth


def test_seeds_counted_as_units_are_refused_and_a_saved_step_is_left_out(fake_run):
    """Two seeds of an objective as two points are refused, naming the rows. A step a run saved
    on its way (step 100 of a 300-step run) is a point inside its run: the comparison over final
    networks leaves it out, so its tables equal those without it; a second row of the same run
    at its last step is still refused."""
    root, models, _ = fake_run
    table = seeded(aggregate(models, *model_paths(root, models), SETTINGS).models)
    with pytest.raises(ReplicationError) as err:
        ols_fits(table, SETTINGS)  # two seeds of an objective as two points
    assert "the OLS fits" in str(err.value) and "obj0: m00, m01" in str(err.value)
    depth = aggregate_depth(fake_run)
    checkpoint = table.iloc[[0]].assign(model="m00_step100", step=100.0)
    assert bool(saved_steps(checkpoint).iloc[0]) and not saved_steps(table).any()
    pooled = pd.concat([table, checkpoint], ignore_index=True)
    with_saved = statistics_tables(pooled, depth, SETTINGS)
    without = statistics_tables(table, depth, SETTINGS)
    pd.testing.assert_frame_equal(with_saved["correlations"], without["correlations"])
    twice = pd.concat([table, table.iloc[[0]].assign(model="m00_again")], ignore_index=True)
    with pytest.raises(ReplicationError, match=r"obj0, seed 0: m00, m00_again"):
        statistics_tables(twice, depth, SETTINGS)

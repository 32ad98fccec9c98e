"""repdiag.binding.stats and repdiag.binding.report: values against independent computations on synthetic data."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.binding import stats
from repdiag.binding.report import (
    aggregate,
    collapse_layer,
    depth_table,
    paper_comparison,
    read_table,
    statistics_tables,
    summary_markdown,
    zoo_curves,
)
from repdiag.binding.stats_options import StatsSettings, check_stats_config
from repdiag.common.claims import study_claims
from repdiag.common.tables import write_csv
from repdiag.core.errors import ConfigError, StoreError
from repdiag.core.store import open_store
from tests.binding.stats_fakes import LAYERS, fake_models, model_paths, write_fake_results

TOL = 1e-8


def correlated(n: int, seed: int = 0, rho: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return x, rho * x + rng.normal(size=n)


def closed_form_pearson(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """r = cov / (sd sd); two-sided p from t = r sqrt((n-2)/(1-r^2)) on n-2 df."""
    n = len(x)
    xc, yc = x - x.sum() / n, y - y.sum() / n
    r = float(np.dot(xc, yc) / math.sqrt(np.dot(xc, xc) * np.dot(yc, yc)))
    t = r * math.sqrt((n - 2) / (1 - r * r))
    return r, float(2 * sps.t.sf(abs(t), n - 2))


# --------------------------------------------------------------------------- correlations


def test_pearson_and_spearman_match_closed_forms():
    x, y = correlated(12)
    result = stats.correlation(x, y, n_boot=200, seed=1)
    r, p = closed_form_pearson(x, y)
    assert result.pearson_r == pytest.approx(r, abs=TOL)
    assert result.pearson_p == pytest.approx(p, abs=TOL)
    rho, p_rho = closed_form_pearson(sps.rankdata(x), sps.rankdata(y))
    assert result.spearman_rho == pytest.approx(rho, abs=TOL)
    assert result.spearman_p == pytest.approx(p_rho, abs=TOL)
    assert result.n == 12 and result.note == ""


def test_rowwise_pearson_matches_numpy_and_flags_constant_rows():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(5, 9)), rng.normal(size=(5, 9))
    x[2] = 0.1  # constant row
    r = stats.rowwise_pearson(x, y)
    for i in (0, 1, 3, 4):
        assert r[i] == pytest.approx(np.corrcoef(x[i], y[i])[0, 1], abs=TOL)
    assert np.isnan(r[2])


def test_bootstrap_interval_is_seeded_and_matches_an_explicit_loop():
    x, y = correlated(10, seed=4)
    first = stats.bootstrap_correlation_ci(x, y, n_boot=300, seed=7)
    assert stats.bootstrap_correlation_ci(x, y, n_boot=300, seed=7) == first
    assert stats.bootstrap_correlation_ci(x, y, n_boot=300, seed=8) != first
    # Independent computation: same draws, one resample at a time with numpy.corrcoef.
    rng = np.random.default_rng(7)
    draws = rng.integers(0, 10, size=(300, 10))
    values = []
    for idx in draws:
        if np.ptp(x[idx]) > 0 and np.ptp(y[idx]) > 0:
            values.append(np.corrcoef(x[idx], y[idx])[0, 1])
    low, high = np.quantile(values, [0.025, 0.975])
    assert first[0] == pytest.approx(low, abs=TOL)
    assert first[1] == pytest.approx(high, abs=TOL)
    assert first[2] == len(values)
    r = np.corrcoef(x, y)[0, 1]
    assert first[0] <= r <= first[1]


def test_spearman_bootstrap_ranks_each_resample():
    x, y = correlated(8, seed=5)
    low, high, valid = stats.bootstrap_correlation_ci(x, y, method="spearman", n_boot=50, seed=2)
    draws = np.random.default_rng(2).integers(0, 8, size=(50, 8))
    rhos = [sps.spearmanr(x[i], y[i]).statistic for i in draws]
    rhos = [r for r in rhos if np.isfinite(r)]
    assert (low, high) == pytest.approx(tuple(np.quantile(rhos, [0.025, 0.975])), abs=TOL)
    assert valid == len(rhos)


def test_too_few_models_and_constant_columns_give_notes_not_errors():
    few = stats.correlation([1.0, 2.0, 3.0], [2.0, 1.0, 4.0])
    assert few.n == 3 and math.isnan(few.pearson_r) and "too few models" in few.note
    flat = stats.correlation([1.0, 2.0, 3.0, 4.0], [0.125] * 4)
    assert math.isnan(flat.pearson_r) and "target constant" in flat.note
    missing = stats.correlation([1.0, np.nan, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 5.0, 4.0])
    assert missing.n == 4  # pairwise-complete rows


def test_correlation_table_rows_per_metric():
    x, y = correlated(9, seed=6)
    table = pd.DataFrame({"binding": y, "jer": x, "g_iso": np.arange(9.0)})
    frame = stats.correlation_table(table, "binding", ["jer", "g_iso"], n_boot=100)
    assert list(frame["metric"]) == ["jer", "g_iso"]
    assert frame.loc[0, "pearson_r"] == pytest.approx(np.corrcoef(x, y)[0, 1], abs=TOL)
    with pytest.raises(ConfigError, match="nope"):
        stats.correlation_table(table, "binding", ["nope"])


# --------------------------------------------------------------------------- OLS


def test_ols_matches_numpy_least_squares():
    rng = np.random.default_rng(10)
    n = 15
    table = pd.DataFrame({"jer": rng.normal(20, 5, n), "same_different": rng.uniform(0.5, 0.9, n)})
    table["binding"] = 0.01 * table["jer"] + 0.3 * table["same_different"] + rng.normal(0, 0.03, n)
    fit = stats.fit_ols(table, "binding", ["jer", "same_different"])
    X = np.column_stack([np.ones(n), table["jer"], table["same_different"]])
    y = table["binding"].to_numpy()
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    dof = n - 3
    s2 = resid @ resid / dof
    se = np.sqrt(np.diag(s2 * np.linalg.inv(X.T @ X)))
    r2 = 1 - (resid @ resid) / ((y - y.mean()) @ (y - y.mean()))
    coefs = fit.coefficients.set_index("term")
    np.testing.assert_allclose(coefs["coef"], coef, rtol=0, atol=TOL)
    np.testing.assert_allclose(coefs["se"], se, rtol=0, atol=TOL)
    np.testing.assert_allclose(coefs["p"], 2 * sps.t.sf(np.abs(coef / se), dof), rtol=0, atol=TOL)
    assert fit.r2 == pytest.approx(r2, abs=TOL)
    assert fit.adj_r2 == pytest.approx(1 - (1 - r2) * (n - 1) / dof, abs=TOL)
    assert list(coefs.index) == ["Intercept", "jer", "same_different"]
    assert "R-squared:" in fit.summary and fit.formula == "binding ~ jer + same_different"
    # A univariate fit's R^2 is the squared Pearson r.
    uni = stats.fit_ols(table, "binding", ["jer"])
    assert uni.r2 == pytest.approx(np.corrcoef(table["jer"], y)[0, 1] ** 2, abs=TOL)


def test_ols_notes_for_too_few_and_collinear():
    table = pd.DataFrame(
        {"binding": [0.1, 0.2, 0.3], "jer": [1.0, 2.0, 4.0], "same_different": [0.5, 0.6, 0.8]}
    )
    fit = stats.fit_ols(table, "binding", ["jer", "same_different"])
    assert math.isnan(fit.r2) and "too few models" in fit.note
    collinear = pd.DataFrame({"binding": [0.1, 0.3, 0.2, 0.4, 0.5], "jer": [1.0, 2, 3, 4, 5]})
    collinear["same_different"] = 2 * collinear["jer"]
    assert "collinear" in stats.fit_ols(collinear, "binding", ["jer", "same_different"]).note
    long = stats.ols_table([fit])
    assert len(long) == 1 and "too few models" in long.loc[0, "note"]
    assert "not fitted" in stats.ols_summary_text([fit])


# --------------------------------------------------------------------------- partial correlation


def test_partial_correlation_is_residual_on_residual():
    rng = np.random.default_rng(11)
    n = 20
    z = rng.normal(size=(n, 2))
    x = z @ [0.8, -0.3] + rng.normal(size=n)
    y = 0.5 * x + z @ [0.2, 0.6] + rng.normal(size=n)
    result = stats.partial_correlation(x, y, z, n_boot=100, seed=0)
    design = np.column_stack([np.ones(n), z])
    rx = x - design @ np.linalg.lstsq(design, x, rcond=None)[0]
    ry = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    r = np.corrcoef(rx, ry)[0, 1]
    dof = n - 2 - 2
    assert result.r == pytest.approx(r, abs=TOL)
    assert result.dof == dof
    assert result.p == pytest.approx(
        2 * sps.t.sf(abs(r * math.sqrt(dof / (1 - r * r))), dof), abs=TOL
    )
    # Precision-matrix form: r_xy.Z = -P_xy / sqrt(P_xx P_yy).
    precision = np.linalg.inv(np.corrcoef(np.column_stack([x, y, z]).T))
    assert result.r == pytest.approx(
        -precision[0, 1] / math.sqrt(precision[0, 0] * precision[1, 1]), abs=TOL
    )
    assert result.ci_low <= result.r <= result.ci_high
    assert result.zero_order_r == pytest.approx(np.corrcoef(x, y)[0, 1], abs=TOL)


def test_partial_table_with_one_covariate_matches_the_textbook_formula():
    rng = np.random.default_rng(12)
    table = pd.DataFrame(rng.normal(size=(10, 3)), columns=["jer", "binding", "zs"])
    frame = stats.partial_table(table, "jer", "binding", [["zs"]], n_boot=100)
    c = table.corr().to_numpy()
    expected = (c[0, 1] - c[0, 2] * c[1, 2]) / math.sqrt((1 - c[0, 2] ** 2) * (1 - c[1, 2] ** 2))
    assert frame.loc[0, "r"] == pytest.approx(expected, abs=TOL)
    assert frame.loc[0, "controls"] == "zs"
    empty = stats.partial_table(table, "jer", "binding", [], empty_note="none configured")
    assert empty.loc[0, "note"] == "none configured"


# --------------------------------------------------------------------------- families


def test_family_means_and_t_intervals():
    table = pd.DataFrame(
        {"model": list("abcd"), "family": ["x", "x", "x", "y"], "jer": [1.0, 2.0, 4.0, 3.0]}
    )
    frame = stats.family_table(table, ["jer"]).set_index("family")
    values = np.array([1.0, 2.0, 4.0])
    half = sps.t.ppf(0.975, 2) * values.std(ddof=1) / math.sqrt(3)
    assert frame.loc["x", "mean"] == pytest.approx(values.mean(), abs=TOL)
    assert frame.loc["x", "ci_high"] - frame.loc["x", "mean"] == pytest.approx(half, abs=TOL)
    assert frame.loc["y", "n"] == 1 and math.isnan(frame.loc["y", "ci_low"])
    assert "no interval" in frame.loc["y", "note"]
    assert frame.loc["x", "models"] == "a;b;c"


# --------------------------------------------------------------------------- aggregation and report


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake")
    models = fake_models(8)
    qualities = write_fake_results(root, models)
    return root, models, qualities


SETTINGS = StatsSettings(n_bootstrap=200, covariates=("zero_shot_accuracy",))


def test_aggregate_joins_metrics_jacobians_and_covariates(fake_run):
    root, models, _ = fake_run
    metrics_paths, jacobian_paths = model_paths(root, models)
    result = aggregate(models, metrics_paths, jacobian_paths, SETTINGS)
    table = result.models.set_index("model")
    assert list(table.index) == list(models)
    # JER at the final layer is the mean over the binding probe images of the stored values.
    ds = open_store(jacobian_paths["m03"])
    binding = ds["probe_set"].values == "binding"
    expected = float(ds["jer_pr"].sel(layer="final").values[binding].mean())
    assert table.loc["m03", "jer_pr_final"] == pytest.approx(expected, rel=1e-6)
    per_layer = ds["jer_entropy"].values[:, binding].mean(axis=1)
    assert table.loc["m03", "jer_entropy_max"] == pytest.approx(per_layer.max(), rel=1e-6)
    assert (table["jer"] == table["jer_pr_final"]).all()
    raw = json.loads(metrics_paths["m03"].read_text())["per_layer"]["final"]
    assert table.loc["m03", "binding_knn"] == raw["binding"]["knn"]["accuracy"]
    assert table.loc["m03", "l_iso_k10"] == raw["geometry"]["l_iso"]["10"]
    assert table.loc["m03", "same_different"] == raw["same_different"]["accuracy"]
    assert table.loc["m03", "same_different_ci_low"] == raw["same_different"]["ci_low"]
    assert (
        table.loc["m03", "zero_shot_accuracy"] == models["m03"]["covariates"]["zero_shot_accuracy"]
    )
    assert table.loc["m03", "family"] == "contrastive"
    # Depth table: one row per layer, formula and probe set (+ all); spectra start at 1.
    depth = result.depth
    assert len(depth[(depth.model == "m03") & (depth.formula == "pr")]) == len(LAYERS) * 3
    spectra = result.spectra[(result.spectra.model == "m03") & (result.spectra.layer == "final")]
    assert spectra.sort_values("rank")["sv_normalised"].iloc[0] == pytest.approx(1.0)
    assert spectra["sv_normalised"].is_monotonic_decreasing


def test_aggregate_errors_name_the_file(fake_run, tmp_path):
    root, models, _ = fake_run
    metrics_paths, jacobian_paths = model_paths(root, models)
    with pytest.raises(StoreError, match="probe set 'folder'"):
        aggregate(models, metrics_paths, jacobian_paths, StatsSettings(probe_set="folder"))
    broken = tmp_path / "m00.json"
    data = json.loads(metrics_paths["m00"].read_text())
    del data["final_layer"]
    broken.write_text(json.dumps(data))
    with pytest.raises(StoreError, match=r"m00\.json: key 'final_layer'"):
        aggregate(models, {**metrics_paths, "m00": broken}, jacobian_paths, SETTINGS)
    with pytest.raises(StoreError, match="does not exist"):
        aggregate(
            models, metrics_paths, {**jacobian_paths, "m00": tmp_path / "none.zarr"}, SETTINGS
        )


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
    assert set(robustness["target"]) == {"binding_cosine", "binding_knn", "binding_local_pca"}
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


def test_paper_comparison_collapse_layer(fake_run):
    root, models, _ = fake_run
    result = aggregate(models, *model_paths(root, models), SETTINGS)
    depth = result.depth.copy()
    mask = (depth.model == "m04") & (depth.formula == "pr") & (depth.probe_set == "binding")
    depth.loc[mask, "jer_mean"] = [20.0, 21.0, 8.0, 7.5, 7.0]  # collapse entering block02
    depth.loc[mask, "drop_ci_low"] = [np.nan, -2.0, 11.0, 0.1, 0.1]
    depth.loc[mask, "drop_ci_high"] = [np.nan, 0.5, 15.0, 0.9, 0.9]
    tables = statistics_tables(result.models, depth, SETTINGS)
    comparison = paper_comparison(result.models, depth, tables, SETTINGS).set_index("claim")
    assert (
        "m04: block02 (depth 0.50, -62%, drop 95% CI [11, 15])"
        in comparison.loc["depth of JER collapse, CLIP/DINOv2", "run_text"]
    )
    depth.loc[mask, "drop_ci_low"] = [np.nan, -2.0, -1.0, 0.1, 0.1]  # the drop is not real
    comparison = paper_comparison(result.models, depth, tables, SETTINGS).set_index("claim")
    assert "m04: no collapse" in comparison.loc["depth of JER collapse, CLIP/DINOv2", "run_text"]
    with pytest.raises(StoreError, match="rerun aggregate_models"):
        paper_comparison(result.models, depth.drop(columns="drop_ci_low"), tables, SETTINGS)


def _profile(per_image: np.ndarray) -> pd.DataFrame:
    """The depth table of one model from per-image JER (layer, image), as aggregate builds it."""
    import xarray as xr

    n_layers, n_images = per_image.shape
    ds = xr.Dataset(
        {"jer_pr": (("layer", "image"), per_image)},
        coords={
            "layer": [f"block{i:02d}" for i in range(n_layers)],
            "image": [f"query/q{i:05d}" for i in range(n_images)],
            "probe_set": ("image", ["binding"] * n_images),
        },
    )
    depth = depth_table(ds, "m", "vision_language")
    return depth[(depth.formula == "pr") & (depth.probe_set == "binding")]


def test_depth_profile_drop_is_the_paired_t_interval_over_images():
    rng = np.random.default_rng(0)
    per_image = rng.uniform(5, 30, size=(3, 12))
    profile = _profile(per_image).set_index("layer")
    assert np.isnan(profile.loc["block00", "drop_mean"])
    paired = per_image[0] - per_image[1]
    low, high = sps.t.interval(0.95, 11, loc=paired.mean(), scale=sps.sem(paired))
    assert profile.loc["block01", "drop_mean"] == pytest.approx(paired.mean())
    assert profile.loc["block01", "drop_ci_low"] == pytest.approx(low)
    assert profile.loc["block01", "drop_ci_high"] == pytest.approx(high)


def test_collapse_rule_flat_noisy_profile_is_no_collapse():
    rng = np.random.default_rng(1)
    assert collapse_layer(_profile(20.0 + rng.normal(0, 1.0, size=(6, 30)))) is None


def test_collapse_rule_a_real_but_small_drop_is_no_collapse():
    rng = np.random.default_rng(2)
    levels = np.array([20.0, 20.0, 18.0, 18.0])[:, None]  # -10%: above noise, below 20%
    profile = _profile(levels + rng.normal(0, 0.05, size=(4, 30)))
    assert profile["drop_ci_low"].iloc[2] > 0  # the interval excludes 0 ...
    assert collapse_layer(profile) is None  # ... but the drop is under the threshold
    assert collapse_layer(profile, threshold=0.05).layer == "block02"


def test_collapse_rule_a_large_tight_drop_is_named():
    rng = np.random.default_rng(3)
    levels = np.array([20.0, 21.0, 12.6, 12.0, 11.8])[:, None]  # -40% entering block02
    found = collapse_layer(_profile(levels + rng.normal(0, 0.3, size=(5, 20))))
    assert found is not None and found.layer == "block02"
    assert found.relative_depth == 0.5 and found.relative_drop == pytest.approx(0.4, abs=0.02)
    assert 0 < found.drop_ci_low < found.drop_mean < found.drop_ci_high
    assert found.text("m").startswith("m: block02 (depth 0.50, -40%, drop 95% CI [")


def test_collapse_rule_a_large_mean_drop_carried_by_few_images_is_no_collapse():
    before = np.array([60.0, 1.0, 50.0, 2.0, 40.0, 3.0])
    after = np.array([1.0, 30.0, 2.0, 25.0, 3.0, 33.0])  # mean 26 -> 15.7: -40%
    profile = _profile(np.stack([before, before, after]))
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
    found = collapse_layer(_profile(mixed))
    assert found is not None and found.layer == "block02"


def test_settings_and_semantic_checks():
    settings = StatsSettings.from_config(
        {"seed": None, "covariates": ["zs"], "jer_formula": "entropy"}, 5
    )
    assert settings.seed == 5 and settings.covariates == ("zs",)
    assert settings.jer_column == "jer_entropy_final"
    config = {"models": fake_models(2), "stats": {"covariates": ["zero_shot_accuracy"]}}
    check_stats_config(config)
    with pytest.raises(ConfigError, match=r"stats\.covariates: 'imagenet'"):
        check_stats_config({**config, "stats": {"covariates": ["imagenet"]}})
    with pytest.raises(ConfigError, match=r"stats\.readout"):
        check_stats_config(
            {**config, "stats": {"readout": "knn"}, "metrics": {"readouts": {"names": ["cosine"]}}}
        )
    clash = fake_models(1)
    clash["m00"]["covariates"] = {"jer_extra": 1.0}
    with pytest.raises(ConfigError, match=r"models\.m00\.covariates\.jer_extra"):
        check_stats_config({"models": clash, "stats": {}})


def test_stats_settings_defaults_are_the_schemas():
    import dataclasses

    from repdiag.core.config import schema_defaults

    schema = schema_defaults("stats")
    fields = {f.name: f.default for f in dataclasses.fields(StatsSettings)}
    assert {k: v for k, v in fields.items() if k != "seed"} == {
        k: tuple(v) if isinstance(v, list) else v for k, v in schema.items() if k != "seed"
    }
    assert StatsSettings.from_config({}, global_seed=7) == StatsSettings(seed=7)

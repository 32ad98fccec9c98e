"""From per-model files to the binding tables: aggregation, statistics, the paper comparison
from claims.yaml and the depth-collapse rule (repdiag.binding.report)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.binding.report import (
    aggregate,
    collapse_layer,
    depth_table,
    model_results,
    paper_comparison,
    read_table,
    statistics_tables,
    summary_markdown,
    zoo_curves,
)
from repdiag.binding.stats_options import StatsSettings
from repdiag.common.claims import study_claims
from repdiag.common.tables import write_csv
from repdiag.core.errors import StoreError
from repdiag.core.store import open_store
from tests.binding.stats_fakes import LAYERS, fake_models, model_paths, write_fake_results

TOL = 1e-8


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake")
    models = fake_models(8)
    qualities = write_fake_results(root, models)
    return root, models, qualities


SETTINGS = StatsSettings(n_bootstrap=200, covariates=("zero_shot_accuracy",))


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


def test_the_summary_lists_every_model_with_intervals_and_jer_by_tap(fake_run):
    root, models, _ = fake_run
    result = aggregate(models, *model_paths(root, models), SETTINGS)
    table = result.models.copy()
    table.loc[table["model"] == "m05", "family"] = "control"
    tables = statistics_tables(table, result.depth, SETTINGS)
    rows = model_results(table, result.depth, SETTINGS).set_index("model")
    assert list(rows.index) == list(table["model"])  # controls too
    first = table.iloc[0]
    low, high = first["binding_cosine_ci_low"], first["binding_cosine_ci_high"]
    assert rows.loc[first["model"], "binding cosine"] == (
        f"{first['binding_cosine']:.3f} [{low:.2f}, {high:.2f}]"
    )
    profile = result.depth.query(
        "model == @first.model and formula == @SETTINGS.jer_formula "
        "and probe_set == @SETTINGS.probe_set"
    ).sort_values("layer_index")
    assert len(profile) >= 2
    expected = " → ".join(f"{v:.1f}" for v in profile["jer_mean"])
    assert rows.loc[first["model"], "JER by tap"] == expected
    assert rows.loc[first["model"], "JER final"] == f"{first['jer']:.1f}"
    text = summary_markdown(table, {**tables, "depth_profiles": result.depth}, SETTINGS)
    assert "## Every model and control" in text and expected in text
    assert "## Every model and control" not in summary_markdown(table, tables, SETTINGS)


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


def test_dose_of_a_zoo_run():
    from repdiag.binding.report import dose_of

    presence = {"objective": "supervised", "family": "supervised"}
    assert dose_of({**presence, "hparams": {"label": "shape_presence", "slot_weight": 0.0}}) == 0.0
    dosed = {"objective": "supervised", "family": "binding_dose", "steps_trained": 0}
    assert dose_of({**dosed, "hparams": {"label": "shape_presence", "slot_weight": 0.3}}) == 0.3
    control = {
        "objective": "supervised",
        "family": "control",
        "hparams": {"label": "shape_presence"},
    }
    assert math.isnan(dose_of(control))
    slots = {"objective": "supervised", "family": "binding_supervised"}
    assert math.isnan(dose_of({**slots, "hparams": {"label": "slot_shape"}}))
    assert math.isnan(dose_of({"objective": "simclr", "family": "contrastive", "hparams": {}}))

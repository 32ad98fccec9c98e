"""The models table: metrics, Jacobian stores, covariates and zoo records joined into one row per
model (repdiag.binding.analysis.aggregate)."""

from __future__ import annotations

import json
import math

import pytest

from repdiag.binding.analysis.aggregate import aggregate, dose_of
from repdiag.binding.analysis.options import StatsSettings
from repdiag.core.errors import StoreError
from repdiag.core.store import open_store
from tests.binding.stats_fakes import LAYERS, SETTINGS, model_paths


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
        aggregate(
            models,
            metrics_paths,
            jacobian_paths,
            StatsSettings.from_config({"probe_set": "folder"}),
        )
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


def test_dose_of_a_zoo_run():
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
    # a null push (the replicate, the causal null arm) keeps the dose; a real push does not
    pushed = {"objective": "supervised", "family": "jer_intervention"}
    pushed |= {"hparams": {"label": "shape_presence", "slot_weight": 0.3}}
    assert dose_of({**pushed, "jer_regulariser": {"weight": 1e-9}}) == 0.3
    assert dose_of({**pushed, "jer_regulariser": {"weight": 1e-6}}) == 0.3
    assert math.isnan(dose_of({**pushed, "jer_regulariser": {"weight": 2e-6}}))


def test_learning_columns_carry_the_run_configuration(tmp_path):
    from repdiag.binding.analysis.aggregate import learning_columns
    from repdiag.binding.analysis.units import configuration

    meta = {
        "objective": "simclr",
        "family": "contrastive",
        "seed": 1,
        "steps": 300,
        "steps_trained": 100,
        "hparams": {},
        "learning": {"left_plateau": True, "slot_probe_gain": 0.01},
    }
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(meta))
    columns = learning_columns(path)
    assert columns["configuration"] == configuration(meta)
    assert (columns["seed"], columns["step"], columns["objective"]) == (1.0, 100.0, "simclr")
    assert math.isnan(learning_columns(None)["configuration"])


def spectrum_store(top, full=None, n_singular=0):
    import numpy as np
    import xarray as xr

    top = np.asarray(top, float)  # (image, rank) at the one layer "final"
    data = {"singular_values": (("layer", "image", "rank"), top[None])}
    coords = {"layer": ["final"], "probe_set": ("image", ["binding"] * top.shape[0])}
    if full is not None:
        data["singular_values_full"] = (("layer", "image", "rank_full"), np.asarray(full)[None])
        data["n_singular"] = (("layer",), [n_singular])
    return xr.Dataset(data, coords=coords)


def test_spectrum_columns_full_spectrum_and_zero_jacobian():
    from repdiag.binding.analysis.aggregate import spectrum_columns

    # two images, whole spectra (3, 1, 0 padding) and (2, 2): pr = (sum s)^2 / sum s^2 =
    # 16/10 and 16/8, pr2 = (sum s^2)^2 / sum s^4 = 100/82 and 64/32; means over images
    store = spectrum_store([[3.0, 1.0], [2.0, 2.0]], [[3.0, 1.0, 0.0], [2.0, 2.0, 0.0]], 3)
    row = spectrum_columns(store, "final", "binding", "fake")
    assert row["pr_full"] == pytest.approx((1.6 + 2.0) / 2)
    assert row["pr2_full"] == pytest.approx((100 / 82 + 2.0) / 2)
    assert row["jacobian_zero"] == 0.0
    without_full = spectrum_columns(spectrum_store([[1.0, 0.5]]), "final", "binding", "fake")
    assert math.isnan(without_full["pr_full"]) and without_full["jacobian_zero"] == 0.0
    zero = spectrum_columns(spectrum_store([[0.0, 0.0]], [[0.0, 0.0]], 2), "final", "binding", "")
    assert zero["jacobian_zero"] == 1.0 and math.isnan(zero["pr_full"])


def test_a_zero_jacobian_has_no_jer(fake_run, monkeypatch):
    """A model whose final-layer Jacobian is zero (a thresholded control) gets JER NaN, so no
    JER correlation takes it; the others keep theirs."""
    from repdiag.binding.analysis import aggregate as module

    root, models, _ = fake_run
    real = module.spectrum_columns

    def zero_for_m00(ds, final_layer, probe_set, path):
        row = real(ds, final_layer, probe_set, path)
        return {**row, "jacobian_zero": 1.0} if "m00" in str(path) else row

    monkeypatch.setattr(module, "spectrum_columns", zero_for_m00)
    table = aggregate(models, *model_paths(root, models), SETTINGS).models.set_index("model")
    jer = [c for c in table.columns if c.startswith("jer")]
    assert table.loc["m00", jer].isna().all()
    assert table.drop(index="m00")["jer"].notna().all()
    assert table.loc["m00", "jacobian_zero"] == 1.0 and table.loc["m01", "jacobian_zero"] == 0.0

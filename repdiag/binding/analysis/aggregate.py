"""The models table: one row per model from its metrics JSON, its Jacobian store, its config
entry (family, source, covariates) and, for zoo runs, its training record.

``aggregate`` joins ``results/metrics/<model>.json`` (geometry, binding per readout,
Same/Different at the final layer), ``results/jacobians/<model>.zarr`` (JER per layer, singular
value spectra; :mod:`repdiag.binding.analysis.depth`) and each model's config entry into one row
per model, plus the depth and spectra tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from repdiag.binding import CONTROL_FAMILY, JER_INTERVENTION_FAMILY
from repdiag.binding.analysis.depth import (
    depth_table,
    jer_columns,
    normalised_spectra,
    read_jacobians,
)
from repdiag.binding.analysis.options import GEOMETRY, READOUTS, StatsSettings, covariate_columns
from repdiag.binding.analysis.units import configuration
from repdiag.binding.metrics.readouts import WIN_RATE_CHANCE
from repdiag.common.tables import json_number
from repdiag.core.errors import ConfigError, StoreError
from repdiag.core.store import read_json
from repdiag.encoders.zoo.spec import NULL_MAX_WEIGHT, binding_dose


def read_metrics(path: str | Path) -> dict[str, Any]:
    """Read ``results/metrics/<model>.json`` and check the keys this stage needs."""
    data = read_json(path)
    for key in ("per_layer", "final_layer"):
        if key not in data:
            raise StoreError(
                f"{path}: key {key!r} is missing; rerun compute_metrics for this model"
            )
    if data["final_layer"] not in data["per_layer"]:
        raise StoreError(
            f"{path}: final_layer {data['final_layer']!r} has no entry in per_layer "
            f"(has {sorted(data['per_layer'])}); rerun compute_metrics for this model"
        )
    return data


def metrics_row(metrics: Mapping[str, Any]) -> dict[str, float | str | int]:
    """Geometry, binding per readout and Same/Different at the final layer, flattened."""
    layer = metrics["per_layer"][metrics["final_layer"]]
    geometry = layer.get("geometry", {})
    sizes = metrics.get("sizes", {})
    row: dict[str, Any] = {
        "final_layer": metrics["final_layer"],
        "n_layers": len(metrics.get("layers") or metrics["per_layer"]),
        "chance": json_number(metrics.get("chance")),
        **{name: json_number(sizes.get(name)) for name in ("n_queries", "n_candidates", "n_pairs")},
    }
    for name in GEOMETRY:
        row[name] = json_number(geometry.get(name))
    for k in sorted(geometry.get("l_iso", {}), key=lambda k: int(k)):
        row[f"l_iso_k{int(k)}"] = json_number(geometry["l_iso"][k])
    binding = layer.get("binding", {})
    notes = []
    for readout in READOUTS:
        result = binding.get(readout) or {}
        row[f"binding_{readout}"] = json_number(result.get("accuracy"))
        row[f"binding_{readout}_ci_low"] = json_number(result.get("ci_low"))
        row[f"binding_{readout}_ci_high"] = json_number(result.get("ci_high"))
        row[f"binding_{readout}_win"] = json_number(result.get("win_rate"))
        row[f"binding_{readout}_win_ci_low"] = json_number(result.get("win_rate_ci_low"))
        row[f"binding_{readout}_win_ci_high"] = json_number(result.get("win_rate_ci_high"))
        if result.get("skipped"):  # a readout that cannot apply to the layer: NaN plus its note
            notes.append(f"binding_{readout}: {result.get('note') or 'skipped'}")
    row["note"] = "; ".join(notes)
    probe = layer.get("same_different", {})
    row["same_different"] = json_number(probe.get("accuracy"))
    row["same_different_ci_low"] = json_number(probe.get("ci_low"))
    row["same_different_ci_high"] = json_number(probe.get("ci_high"))
    return row


@dataclass
class Aggregate:
    """The aggregation's three tables."""

    models: pd.DataFrame
    depth: pd.DataFrame
    spectra: pd.DataFrame = field(default_factory=pd.DataFrame)


ZOO_COLUMNS = (
    "run",
    "learned",
    "slot_probe_gain",
    "dose",
    "step",
    "seed",
    "objective",
    "configuration",
)


def dose_of(meta: Mapping[str, Any]) -> float:
    """The binding dose lambda of a zoo run (its slot-label weight beside presence labels): 0 for
    a presence-supervised run told no slots, NaN for every run outside the dose series (other
    labels or objectives, the random-initialised control, runs with a push). A run whose push is
    null (|weight| <= NULL_MAX_WEIGHT: the dose series' replicate, binding_causal's null arm)
    keeps its dose: it is another draw of the same design."""
    hparams = meta.get("hparams") or {}
    if meta.get("objective") != "supervised" or hparams.get("label") != "shape_presence":
        return math.nan
    if meta.get("family") == CONTROL_FAMILY:
        return math.nan  # steps: 0 is a control
    push = abs(float((meta.get("jer_regulariser") or {}).get("weight") or 0.0))
    if meta.get("family") == JER_INTERVENTION_FAMILY and push > NULL_MAX_WEIGHT:
        return math.nan  # a regularised run is binding_causal's, not a dose
    return binding_dose(str(meta["objective"]), hparams)


def learning_columns(meta_path: str | Path | None) -> dict[str, Any]:
    """The zoo run's name, ``learned`` and the probe gain of its ``meta.json`` (``learning``), its binding
    dose, the steps it trained, its seed, objective and configuration (every setting but the
    seed and ``stop_at``: the unit the seeds of an objective are nested in,
    :func:`repdiag.binding.analysis.units.configuration`); NaN for models the workflow did not
    train."""
    if meta_path is None:
        return dict.fromkeys(ZOO_COLUMNS, math.nan)
    meta = read_json(meta_path)
    learning = meta.get("learning")
    if not isinstance(learning, Mapping) or "left_plateau" not in learning:
        raise StoreError(f"{meta_path}: no 'learning' record; rerun train_zoo for this run")
    return {
        "run": str(meta.get("run") or math.nan),  # the zoo run (a saved step: <run>-step<t>)
        "learned": float(bool(learning["left_plateau"])),
        "slot_probe_gain": json_number(learning.get("slot_probe_gain")),
        "dose": dose_of(meta),
        "step": json_number(meta.get("steps_trained", meta.get("steps"))),
        "seed": json_number(meta.get("seed")),
        "objective": str(meta.get("objective") or math.nan),
        "configuration": configuration(meta),
    }


def spectrum_columns(ds: Any, final_layer: str, probe_set: str, path: str | Path) -> dict:
    """``pr_full``, ``pr2_full``: mean over the probe images of the whole-spectrum pr and pr2 at
    the final layer (``singular_values_full``, kept where the layer was computed exactly; NaN
    otherwise), and ``jacobian_zero``: 1.0 when every singular value there is 0, a map whose
    Jacobian is zero by construction (a thresholded control), whose JER is undefined, not 0."""
    import numpy as np

    from repdiag.binding.analysis.depth import select_images
    from repdiag.binding.metrics.geometry import participation_ratio_of_spectrum as pr

    layers = [str(name) for name in ds["layer"].values]
    index = layers.index(final_layer) if final_layer in layers else len(layers) - 1
    mask = select_images(ds, probe_set, path)
    top = np.asarray(ds["singular_values"].transpose("layer", "image", "rank").values, float)
    row = {"pr_full": math.nan, "pr2_full": math.nan}
    row["jacobian_zero"] = float(not np.any(top[index][mask]))
    n = int(ds["n_singular"].values[index]) if "n_singular" in ds else 0
    if "singular_values_full" in ds and n > 0 and not row["jacobian_zero"]:
        full = np.asarray(ds["singular_values_full"].values[index], float)[mask, :n]
        values = np.stack([pr(full), pr(full**2)], axis=1)  # (sum s)^2/sum s^2 and of s^2
        values[~np.any(full, axis=1)] = math.nan  # a zero map's rank is undefined, not 0
        row["pr_full"], row["pr2_full"] = (float(v) for v in np.nanmean(values, axis=0))
    return row


def aggregate(
    models: Mapping[str, Mapping[str, Any]],
    metrics_paths: Mapping[str, str | Path],
    jacobian_paths: Mapping[str, str | Path],
    settings: StatsSettings,
    zoo_meta_paths: Mapping[str, str | Path] | None = None,
) -> Aggregate:
    """One row per model (config order): identity, final-layer metrics, JER, covariates, and for
    zoo models whether their run learned (``zoo_meta_paths``: model -> its run's meta.json).

    ``jer`` is ``jer_<formula>_<at>`` of the settings and ``binding`` is ``binding_<readout>``:
    the two quantities of the headline analysis, named once for every later table.
    """
    covariates = covariate_columns(models)
    rows, depths, spectra = [], [], []
    for key, entry in models.items():
        family = str(entry.get("family", "other"))
        metrics = read_metrics(metrics_paths[key])
        path = jacobian_paths[key]
        ds = read_jacobians(path, settings.jer_formula)
        profile = depth_table(ds, key, family, path=path, confidence=settings.confidence)
        row = {"model": key, "family": family, "source": str(entry.get("source", ""))}
        row |= metrics_row(metrics)
        row |= jer_columns(profile, metrics["final_layer"], settings.probe_set)
        row |= spectrum_columns(ds, metrics["final_layer"], settings.probe_set, path)
        if row["jacobian_zero"]:  # JER of a zero map is undefined: no JER correlation takes it
            row |= {c: math.nan for c in row if c.startswith("jer_")}
        row |= learning_columns((zoo_meta_paths or {}).get(key))
        for name in covariates:
            row[name] = json_number(entry.get("covariates", {}).get(name))
        rows.append(row)
        depths.append(profile)
        spectra.append(normalised_spectra(ds, key, family, settings.probe_set, path=path))
    table = pd.DataFrame(rows)
    if table.empty:
        raise ConfigError("config.models is empty: there is nothing to aggregate")
    table["jer"] = table[settings.jer_column]
    table["binding"] = table[settings.binding_column]
    table["binding_chance"] = (
        WIN_RATE_CHANCE if settings.binding_score == "win_rate" else table["chance"]
    )
    return Aggregate(
        models=table,
        depth=pd.concat(depths, ignore_index=True),
        spectra=pd.concat(spectra, ignore_index=True),
    )

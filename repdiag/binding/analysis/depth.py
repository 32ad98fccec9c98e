"""JER by depth from the Jacobian stores: per-layer means with intervals, normalised spectra and the
headline JER columns (``jer_<formula>_final``, ``_max``) of one model.

Every stage that reads ``results/jacobians/<model>.zarr`` for JER reads it here: the aggregation
of the models table, the causal effects and (through the workflow) the SugarCrepe tables.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding.analysis.options import JER_FORMULAS, StatsSettings
from repdiag.common.intervals import mean_interval
from repdiag.core.errors import StoreError
from repdiag.core.store import open_store
from repdiag.encoders.jacobian.store import STORE_CONTRACT


def read_jacobians(path: str | Path, formula: str) -> Any:
    """Open ``results/jacobians/<model>.zarr`` (validated) with the arrays this stage needs."""
    return open_store(path, required=["singular_values", f"jer_{formula}"], contract=STORE_CONTRACT)


def probe_sets(ds: Any) -> np.ndarray:
    """Probe-set label of each image; every image counts as ``all`` as well."""
    if "probe_set" not in ds.coords and "probe_set" not in ds.variables:
        return np.full(ds.sizes["image"], "unlabelled", dtype=object)
    return np.asarray(ds["probe_set"].values).astype(str)


def select_images(ds: Any, probe_set: str, path: str | Path) -> np.ndarray:
    labels = probe_sets(ds)
    mask = np.ones(len(labels), bool) if probe_set == "all" else labels == probe_set
    if not mask.any():
        raise StoreError(
            f"store {path}: no images of probe set {probe_set!r} (it has {sorted(set(labels))}); "
            "set stats.probe_set to one of them or to 'all'"
        )
    return mask


def depth_table(
    ds: Any, model: str, family: str, *, confidence: float, path: str | Path = ""
) -> pd.DataFrame:
    """Mean JER per layer, formula and probe set (plus ``all``) with a t-interval over images.

    ``drop_mean``, ``drop_ci_low``, ``drop_ci_high``: the drop from the previous layer, the mean
    over images of ``JER_{l-1}(x) - JER_l(x)`` with its paired t-interval (positive = JER falls;
    NaN at the first layer), which :func:`collapse_layer` tests.
    """
    layers = [str(name) for name in ds["layer"].values]
    labels = probe_sets(ds)
    rows = []
    for formula in JER_FORMULAS:
        if f"jer_{formula}" not in ds:
            continue
        values = np.asarray(ds[f"jer_{formula}"].transpose("layer", "image").values, dtype=float)
        for probe_set in [*sorted(set(labels)), "all"]:
            mask = select_images(ds, probe_set, path)
            for index, layer in enumerate(layers):
                mean, _, low, high = mean_interval(values[index, mask], confidence)
                drop = (math.nan,) * 4
                if index > 0:
                    paired = values[index - 1, mask] - values[index, mask]
                    drop = mean_interval(paired, confidence)
                rows.append(
                    {
                        "model": model,
                        "family": family,
                        "layer": layer,
                        "layer_index": index,
                        "relative_depth": index / (len(layers) - 1) if len(layers) > 1 else 1.0,
                        "probe_set": probe_set,
                        "formula": formula,
                        "jer_mean": mean,
                        "jer_ci_low": low,
                        "jer_ci_high": high,
                        "n_images": int(mask.sum()),
                        "drop_mean": drop[0],
                        "drop_ci_low": drop[2],
                        "drop_ci_high": drop[3],
                    }
                )
    return pd.DataFrame(rows)


def normalised_spectra(
    ds: Any, model: str, family: str, probe_set: str, *, path: str | Path = ""
) -> pd.DataFrame:
    """Per layer and rank: mean over images of s_i / s_1 (and of s_i), probe set ``probe_set``."""
    mask = select_images(ds, probe_set, path)
    values = np.asarray(
        ds["singular_values"].transpose("layer", "image", "rank").values, dtype=float
    )[:, mask]
    top = values[..., :1]
    with np.errstate(invalid="ignore", divide="ignore"):
        normalised = np.where(top > 0, values / np.where(top > 0, top, 1.0), np.nan)
    rows = []
    for index, layer in enumerate(str(name) for name in ds["layer"].values):
        norm_mean = np.nanmean(normalised[index], axis=0)
        raw_mean = values[index].mean(axis=0)
        for rank in range(values.shape[-1]):
            rows.append(
                {
                    "model": model,
                    "family": family,
                    "layer": layer,
                    "layer_index": index,
                    "probe_set": probe_set,
                    "rank": rank + 1,
                    "sv_mean": raw_mean[rank],
                    "sv_normalised": norm_mean[rank],
                }
            )
    return pd.DataFrame(rows)


def jer_columns(profile: pd.DataFrame, final_layer: str, probe_set: str) -> dict[str, float]:
    """``jer_<formula>_final`` (at ``final_layer``, else the deepest layer) and ``_max`` over layers."""
    row = {}
    for formula in JER_FORMULAS:
        part = profile[(profile["formula"] == formula) & (profile["probe_set"] == probe_set)]
        if part.empty:
            row[f"jer_{formula}_final"] = row[f"jer_{formula}_max"] = math.nan
            continue
        at_final = part[part["layer"] == final_layer]
        final = (
            at_final
            if not at_final.empty
            else part[part["layer_index"] == part["layer_index"].max()]
        )
        row[f"jer_{formula}_final"] = float(final["jer_mean"].iloc[0])
        row[f"jer_{formula}_max"] = float(part["jer_mean"].max())
    return row


def headline_jer(path: str | Path, model: str, family: str, settings: StatsSettings) -> float:
    """The model's headline JER (``settings.jer_column``) from its Jacobian store, read as the
    aggregation reads it (at the layer named ``final``, else the deepest)."""
    ds = read_jacobians(path, settings.jer_formula)
    profile = depth_table(ds, model, family, path=path, confidence=settings.confidence)
    return jer_columns(profile, "final", settings.probe_set)[settings.jer_column]

"""The JER intervention (``binding_causal``): JER manipulated against a sham, binding measured.

Per base (a dose of the binding dose series, lambda = 0.3 or 1) and seed, four training runs
that differ only in a term on the final tap's JER, ``L = L_objective - w_t * mean PR2_hat``
(repdiag.encoders.zoo.train, repdiag.binding.causal_options): ``plain`` (w_t = 0), ``raise``
(+w), ``lower`` (-w) and ``sham`` (+-w at random each step: the same gradient norm, no net push).
The unit is the training run; the seed pairs the arms (same initialisation, batches,
augmentations and probes). The analysis, fixed before the run:

1. Loss screen: a run whose final objective loss (meta.json ``final_loss_mean``, the regulariser
   left out) lies more than ``loss_spread_sd`` standard deviations (over seeds) from the plain
   runs' mean is reported and left out of every contrast; its seed drops from the pairs it is in.
2. Primary estimate: per seed, binding (``stats.readout``) and Same/Different of raise, lower
   and plain minus the sham's; the mean over seeds with its Student-t interval and the
   parametric two-sided one-sample t p beside it (n = seeds). Against plain as well.
3. Manipulation check: the same per-seed contrasts of top-k JER (``stats.jer_formula`` over the
   top ``jacobians.k`` singular values, the engine's) and of the full-spectrum ``pr`` =
   (sum s)^2 / sum s^2 and ``pr2`` = (sum s^2)^2 / sum s^4 (the store's
   ``singular_values_full``, exact at the 256-wide final tap), each against plain and the sham.

Query-level intervals (Wilson over the queries of one network) describe measurement precision
of a fixed network, not variation between training runs: they are reported per run, never used
as the effect's interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding.analysis.depth import select_images
from repdiag.common.replication import Units, require_independent, t_interval
from repdiag.core.errors import StoreError
from repdiag.core.store import open_store, read_json
from repdiag.encoders.jacobian.store import STORE_CONTRACT

UNIT = "training run (seed)"
EFFECT_METRICS = ("binding", "same_different")
CHECK_METRICS = ("jer", "pr_full", "pr2_full")
CONTRASTS = (
    ("raise", "sham"),
    ("lower", "sham"),
    ("plain", "sham"),
    ("raise", "plain"),
    ("lower", "plain"),
    ("sham", "plain"),
)
"""(arm, reference) pairs, per seed: against the sham first (the primary estimate)."""


def full_spectrum_participation(s: np.ndarray) -> tuple[float, float]:
    """(pr, pr2) of one whole spectrum s: (sum s)^2 / sum s^2 and (sum s^2)^2 / sum s^4; NaN
    for an all-zero spectrum (the rank of a zero map is undefined)."""
    s = np.asarray(s, dtype=float)
    s2 = float(np.sum(s**2))
    if s2 == 0.0:
        return math.nan, math.nan
    return float(np.sum(s) ** 2 / s2), float(s2**2 / np.sum(s**4))


def full_spectrum_jer(path: str | Path, final_layer: str, probe_set: str) -> dict[str, float]:
    """Mean over the ``probe_set`` images of the full-spectrum pr and pr2 at ``final_layer`` of
    one Jacobian store; NaN where that layer was not computed exactly (no full spectrum)."""
    ds = open_store(path, required=["singular_values"], contract=STORE_CONTRACT)
    layers = [str(name) for name in ds["layer"].values]
    if final_layer not in layers:
        raise StoreError(
            f"store {path}: no layer {final_layer!r} (has {layers}); rerun jacobian_spectra"
        )
    index = layers.index(final_layer)
    if "singular_values_full" not in ds or int(ds["n_singular"].values[index]) == 0:
        return {"pr_full": math.nan, "pr2_full": math.nan}
    n = int(ds["n_singular"].values[index])
    spectra = np.asarray(ds["singular_values_full"].values[index], dtype=float)[:, :n]
    mask = select_images(ds, probe_set, path)
    values = np.array([full_spectrum_participation(s) for s in spectra[mask]])
    return {"pr_full": float(np.nanmean(values[:, 0])), "pr2_full": float(np.nanmean(values[:, 1]))}


def run_record(meta_path: str | Path) -> dict[str, Any]:
    """What one run's ``meta.json`` says the analysis needs: final objective loss, |weight|,
    whether a sham, the steps pushed up and down (0 for a plain run)."""
    meta = read_json(meta_path)
    if "final_loss_mean" not in meta:
        raise StoreError(f"{meta_path}: no final_loss_mean; rerun train_zoo for this run")
    record = meta.get("jer_regulariser") or {}
    return {
        "final_loss": float(meta["final_loss_mean"]),
        "weight": float(record.get("weight") or 0.0),
        "steps_up": int(record.get("steps_up") or 0),
        "steps_down": int(record.get("steps_down") or 0),
    }


def arm_table(
    cells: Sequence[Mapping[str, Any]],
    table: pd.DataFrame,
    extras: Mapping[str, Mapping[str, Any]],
    binding_column: str,
) -> pd.DataFrame:
    """One row per (base, arm, seed): the cell, its model's binding (with the query-level Wilson
    interval), Same/Different, top-k ``jer`` (from ``table``, the aggregate) and what ``extras``
    adds per model (full-spectrum pr and pr2, :func:`run_record`)."""
    by_model = table.set_index("model")
    rows = []
    for cell in cells:
        model = cell["model"]
        if model not in by_model.index:
            raise StoreError(f"model {model!r} of the causal arms is not in the aggregate table")
        row = by_model.loc[model]
        rows.append(
            {
                **{key: cell[key] for key in ("base", "dose", "arm", "seed", "model")},
                "binding": float(row[binding_column]),
                "binding_ci_low": float(row.get(f"{binding_column}_ci_low", math.nan)),
                "binding_ci_high": float(row.get(f"{binding_column}_ci_high", math.nan)),
                "same_different": float(row["same_different"]),
                "jer": float(row["jer"]),
                **dict(extras.get(model) or {}),
            }
        )
    return pd.DataFrame(rows)


def screen_losses(arms: pd.DataFrame, spread_sd: float) -> pd.DataFrame:
    """Add ``plain_loss_mean``, ``plain_loss_sd`` (over the base's plain seeds), ``loss_z`` and
    ``left_out``: |loss - mean| > spread_sd x sd. With fewer than 2 plain seeds there is no
    spread and nothing is left out."""
    out = arms.copy()
    for base, part in out.groupby("base", sort=False):
        plain = part.loc[part["arm"] == "plain", "final_loss"].to_numpy(float)
        mean = float(plain.mean()) if len(plain) else math.nan
        sd = float(plain.std(ddof=1)) if len(plain) >= 2 else math.nan
        rows = out["base"] == base
        out.loc[rows, "plain_loss_mean"] = mean
        out.loc[rows, "plain_loss_sd"] = sd
        z = (out.loc[rows, "final_loss"] - mean) / sd if sd > 0 else math.nan
        out.loc[rows, "loss_z"] = z
    out["left_out"] = out["loss_z"].abs() > spread_sd
    return out


def seed_contrast(
    arms: pd.DataFrame, metric: str, arm: str, reference: str, confidence: float
) -> dict[str, Any]:
    """Per seed, ``metric`` of ``arm`` minus that of ``reference`` (both kept by the loss
    screen); their mean, sample SD, t-interval over seeds and the parametric two-sided
    one-sample t p (H0: no change), n = seeds (:func:`repdiag.common.replication.t_interval`)."""
    kept = arms[~arms["left_out"]]
    a = kept[kept["arm"] == arm].set_index("seed")[metric]
    b = kept[kept["arm"] == reference].set_index("seed")[metric]
    seeds = sorted(set(a.index) & set(b.index))
    all_seeds = sorted(set(arms.loc[arms["arm"].isin([arm, reference]), "seed"]))
    diffs = np.array([a[s] - b[s] for s in seeds], dtype=float)
    diffs = diffs[np.isfinite(diffs)]
    mean, se, low, high, p = t_interval(diffs.tolist(), confidence)
    sd = se * math.sqrt(len(diffs)) if len(diffs) >= 2 else math.nan
    return {
        "metric": metric,
        "arm": arm,
        "reference": reference,
        "unit": UNIT,
        "n": len(diffs),
        "mean": mean,
        "sd": sd,
        "ci_low": low,
        "ci_high": high,
        "p": p,
        "seeds": " ".join(str(s) for s in seeds),
        "seeds_left_out": " ".join(str(s) for s in all_seeds if s not in seeds),
    }


def causal_contrasts(arms: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """``contrasts.csv``: per base, every metric (effects, then the manipulation check) and every
    (arm, reference) pair of :data:`CONTRASTS` present in the base (module docstring)."""
    rows = []
    for base, part in arms.groupby("base", sort=False):
        cells = zip(part["arm"], part["seed"], strict=True)
        names = [f"{base} {arm} seed {seed}" for arm, seed in cells]
        # one row per training run: a model listed for two cells would count twice
        require_independent(Units.of(part, "model", "seed"), names, f"the causal base {base}")
        present = set(part["arm"])
        for role, metrics in (("effect", EFFECT_METRICS), ("manipulation", CHECK_METRICS)):
            for metric in metrics:
                for arm, reference in CONTRASTS:
                    if {arm, reference} <= present:
                        record = seed_contrast(part, metric, arm, reference, confidence)
                        rows.append({"base": base, "role": role, **record})
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["confidence"] = confidence
    return frame

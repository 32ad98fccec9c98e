"""The JER intervention (``binding_causal``): JER, or global geometry, moved by a push during
training; binding measured; every arm against the plain run of its seed, by intention to treat.

Per base (the dose series' lambda = 0.3) and seed, six training runs that differ only in a push
added to the objective's gradient on the backbone (repdiag.encoders.zoo.regulariser,
repdiag.binding.causal.options): ``plain`` (none), ``raise`` and ``lower`` (the final tap's
estimated PR2 up, and down at half the strength), ``sham`` (a fixed seeded direction orthogonal
to both gradients, as large as the raise arm's push), ``geometry`` (the batch's G.PR up) and
``null`` (a negligible push: how far chaos alone takes a run). The unit is the training run; the
seed pairs the arms (same initialisation, batches, augmentations and probes). The analysis,
written before the run (docs/binding.md):

1. Intention to treat: every run is kept. A run whose loss is not finite stops with an error
   (its job fails), so no table holds a run that was dropped on its outcome. The held-out
   presence loss is a mediator, reported per arm, never a filter.
2. Primary family, Holm-adjusted: per seed, binding (``stats.readout``, final tap) and
   Same/Different of each of raise, lower, sham and geometry minus plain (8 tests); the mean over
   seeds with its Student-t interval, the t p and the exact sign-flip p
   (:func:`repdiag.common.exact.sign_flip_p`); Holm over the 8 sign-flip p.
3. Secondary family, Holm-adjusted apart: raise - sham, geometry - sham, raise - geometry.
4. The floor: null - plain, reported beside every contrast, in no family.
5. Manipulation matrix: each arm minus plain in top-k JER, full-spectrum pr and pr2, G.PR,
   G.Iso, every L.Iso and the held-out presence loss.
6. Displacement (:func:`displacement`): per arm and seed, ||theta_arm - theta_plain|| /
   ||theta_plain|| on the backbone's weights, and the component of theta_arm - theta_plain along
   the arm's own cumulative push P; the sham and geometry arms are read against the raise arm's
   component (matched within 25%, or the summary says by how much not), every distance against
   the null arm's.
7. Interventional against observational: the raise arm's binding change per unit of JER change
   (ratio of the mean differences, percentile interval over seed resamples), and across the
   plain seeds, the association of binding with JER and with G.PR at the one dose.

Query-level intervals (Wilson over the queries of one network) describe measurement precision
of a fixed network, not variation between training runs: they are reported per run, never used
as an effect's interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding.analysis.aggregate import spectrum_columns
from repdiag.binding.analysis.columns import l_iso_columns
from repdiag.common.exact import holm, sign_flip_p
from repdiag.common.replication import t_interval
from repdiag.common.units import Units, require_independent
from repdiag.core.errors import StoreError
from repdiag.core.store import open_store, read_json
from repdiag.encoders.jacobian.store import STORE_CONTRACT
from repdiag.encoders.zoo.spec import DEFAULT_TERM

UNIT = "training run (seed)"
EFFECT_METRICS = ("binding", "same_different")
ACTIVE_ARMS = ("raise", "lower", "sham", "geometry")
PRIMARY = tuple((arm, "plain") for arm in ACTIVE_ARMS)
"""The primary contrasts: each active arm against plain, on each effect metric (Holm family)."""
SECONDARY = (("raise", "sham"), ("geometry", "sham"), ("raise", "geometry"))
"""Does the push's aim matter at matched size? A second Holm family."""
FLOOR = (("null", "plain"),)
"""How far a negligible push moves a run: read against every contrast, in no family."""
MANIPULATION_METRICS = ("jer", "pr_full", "pr2_full", "g_pr", "g_iso", "presence_loss")
"""Besides every L.Iso column: what each arm moved, against plain."""
MATCH_TOLERANCE = 0.25
"""The sham and geometry arms' displacement along their push, against the raise arm's."""
PRESENCE_TERM = "shape_presence"


def full_spectrum_jer(path: str | Path, final_layer: str, probe_set: str) -> dict[str, float]:
    """Mean over the ``probe_set`` images of the full-spectrum pr and pr2 at ``final_layer`` of
    one Jacobian store (:func:`repdiag.binding.analysis.aggregate.spectrum_columns`); NaN where
    that layer was not computed exactly (no full spectrum)."""
    ds = open_store(path, required=["singular_values"], contract=STORE_CONTRACT)
    layers = [str(name) for name in ds["layer"].values]
    if final_layer not in layers:
        raise StoreError(
            f"store {path}: no layer {final_layer!r} (has {layers}); rerun jacobian_spectra"
        )
    columns = spectrum_columns(ds, final_layer, probe_set, path)
    return {"pr_full": columns["pr_full"], "pr2_full": columns["pr2_full"]}


def run_record(meta_path: str | Path) -> dict[str, Any]:
    """What one run's ``meta.json`` says the analysis needs: the training loss (its last tenth,
    with the dose's slot term), the held-out presence loss (``evaluation_losses``; the mediator),
    the signed weight and term, and what the push did (steps acted, ||P||, realised share of the
    step); 0 and NaN for a plain run."""
    meta = read_json(meta_path)
    if "final_loss_mean" not in meta:
        raise StoreError(f"{meta_path}: no final_loss_mean; rerun train_zoo for this run")
    record = meta.get("jer_regulariser") or {}
    held_out = meta.get("evaluation_losses") or {}
    return {
        "final_loss": float(meta["final_loss_mean"]),
        "presence_loss": float(held_out.get(PRESENCE_TERM, math.nan)),
        "weight": float(record.get("weight") or 0.0),
        "term": str(record.get("term", DEFAULT_TERM)) if record else "",
        "steps_acted": int(record.get("steps_acted") or 0),
        "update_share": float(record.get("update_share_median", math.nan)),
    }


def arm_table(
    cells: Sequence[Mapping[str, Any]],
    table: pd.DataFrame,
    extras: Mapping[str, Mapping[str, Any]],
    binding_column: str,
) -> pd.DataFrame:
    """One row per (base, arm, seed): the cell, its model's binding (with the query-level Wilson
    interval), Same/Different, top-k ``jer``, G.PR, G.Iso and L.Iso (from ``table``, the
    aggregate) and what ``extras`` adds per model (full-spectrum pr and pr2, :func:`run_record`,
    :func:`displacement`)."""
    by_model = table.set_index("model")
    geometry = ["g_pr", "g_iso", *l_iso_columns(table)]
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
                **{name: float(row.get(name, math.nan)) for name in geometry},
                **dict(extras.get(model) or {}),
            }
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- displacement


def _flat(tensors: Mapping[str, Any], keys: Sequence[str]) -> np.ndarray:
    return np.concatenate([np.asarray(tensors[k], dtype=np.float64).ravel() for k in keys])


def displacement(
    arm_weights: Mapping[str, Any], plain_weights: Mapping[str, Any], push: Mapping[str, Any]
) -> dict[str, float]:
    """On the parameters the push covers (the backbone's trainable weights), with
    delta = theta_arm - theta_plain: ``distance`` ||delta|| / ||theta_plain||, ``along_push``
    <delta, P> / ||P|| (how far the arm moved along its own cumulative push P) and ``push_norm``
    ||P||. A parameter missing from either network is an error naming it."""
    keys = sorted(push)
    missing = [k for k in keys if k not in arm_weights or k not in plain_weights]
    if missing:
        raise StoreError(f"push parameters {missing[:5]} are missing from the arm or plain weights")
    arm, plain, p = _flat(arm_weights, keys), _flat(plain_weights, keys), _flat(push, keys)
    delta = arm - plain
    norm_p, norm_plain = float(np.linalg.norm(p)), float(np.linalg.norm(plain))
    return {
        "distance": float(np.linalg.norm(delta)) / norm_plain if norm_plain > 0 else math.nan,
        "along_push": float(delta @ p / norm_p) if norm_p > 0 else math.nan,
        "push_norm": norm_p,
    }


def weight_displacements(
    cells: Sequence[Mapping[str, Any]],
    weights: Mapping[str, str | Path],
    pushes: Mapping[str, str | Path],
) -> dict[str, dict[str, float]]:
    """Per model of a pushed arm, :func:`displacement` against the plain run of its base and
    seed (``weights``: each model's model.safetensors; ``pushes``: each pushed model's
    push.safetensors). Plain runs: distance 0."""
    from safetensors.numpy import load_file

    plain = {(c["base"], c["seed"]): c["model"] for c in cells if c["arm"] == "plain"}
    out: dict[str, dict[str, float]] = {}
    loaded_plain: dict[str, Mapping[str, Any]] = {}
    for cell in cells:
        model = cell["model"]
        if cell["arm"] == "plain":
            out[model] = {"distance": 0.0, "along_push": 0.0, "push_norm": 0.0}
            continue
        if model not in pushes:
            raise StoreError(f"no push.safetensors for {model!r}; rerun train_zoo for its run")
        reference = plain[(cell["base"], cell["seed"])]
        if reference not in loaded_plain:
            loaded_plain[reference] = load_file(str(weights[reference]))
        out[model] = displacement(
            load_file(str(weights[model])), loaded_plain[reference], load_file(str(pushes[model]))
        )
    return out


# --------------------------------------------------------------------------- contrasts


def seed_contrast(
    arms: pd.DataFrame, metric: str, arm: str, reference: str, confidence: float
) -> dict[str, Any]:
    """Per seed, ``metric`` of ``arm`` minus that of ``reference``, every run kept; their mean,
    SD, t-interval over seeds, the two-sided one-sample t p and the exact sign-flip p
    (H0: no change), n = seeds with both runs (a seed missing an arm is named)."""
    a = arms[arms["arm"] == arm].set_index("seed")[metric]
    b = arms[arms["arm"] == reference].set_index("seed")[metric]
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
        "p_t": p,
        "p_exact": sign_flip_p(diffs) if len(diffs) else math.nan,
        "seeds": " ".join(str(s) for s in seeds),
        "seeds_missing": " ".join(str(s) for s in all_seeds if s not in seeds),
    }


def _contrast_rows(
    part: pd.DataFrame, pairs: Sequence[tuple[str, str]], metrics: Sequence[str], confidence: float
) -> list[dict[str, Any]]:
    present = set(part["arm"])
    return [
        seed_contrast(part, metric, arm, reference, confidence)
        for metric in metrics
        for arm, reference in pairs
        if {arm, reference} <= present and metric in part.columns
    ]


def causal_contrasts(arms: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """``contrasts.csv``: per base, the primary and secondary families (each with Holm's
    adjustment of its exact p, ``p_holm``), the floor (null - plain) and the manipulation matrix
    (module docstring)."""
    rows = []
    for base, part in arms.groupby("base", sort=False):
        cells = zip(part["arm"], part["seed"], strict=True)
        names = [f"{base} {arm} seed {seed}" for arm, seed in cells]
        # one row per training run: a model listed for two cells would count twice
        require_independent(Units.of(part, "model", "seed"), names, f"the causal base {base}")
        manipulation = [*MANIPULATION_METRICS, *l_iso_columns(part)]
        groups = (
            ("primary", _contrast_rows(part, PRIMARY, EFFECT_METRICS, confidence)),
            ("secondary", _contrast_rows(part, SECONDARY, EFFECT_METRICS, confidence)),
            ("floor", _contrast_rows(part, FLOOR, EFFECT_METRICS, confidence)),
            (
                "manipulation",
                _contrast_rows(part, [*PRIMARY, *FLOOR], manipulation, confidence),
            ),
        )
        for family, records in groups:
            adjusted = (
                holm([r["p_exact"] for r in records])
                if family in ("primary", "secondary")
                else [math.nan] * len(records)
            )
            for record, p_holm in zip(records, adjusted, strict=True):
                rows.append(
                    {
                        "base": base,
                        "family": family,
                        **record,
                        "family_size": len(records) if family in ("primary", "secondary") else 0,
                        "p_holm": float(p_holm),
                    }
                )
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["confidence"] = confidence
    return frame


# --------------------------------------------------------------------------- displacement summary


def displacement_summary(arms: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """Per base and pushed arm: the mean over seeds (t-interval) of ``distance`` and
    ``along_push``; ``along_push_vs_raise`` (the arm's mean along its push over the raise arm's)
    and ``matched`` (within :data:`MATCH_TOLERANCE` of the raise arm's, for sham and geometry);
    ``distance_vs_null`` (the arm's mean distance over the null arm's)."""
    rows = []
    for base, part in arms.groupby("base", sort=False):
        means: dict[str, dict[str, float]] = {}
        for arm, runs in part[part["arm"] != "plain"].groupby("arm", sort=False):
            stats = {}
            for column in ("distance", "along_push", "update_share"):
                values = runs[column].to_numpy(float) if column in runs else np.array([])
                mean, _, low, high, _ = t_interval(values.tolist(), confidence)
                stats |= {column: mean, f"{column}_ci_low": low, f"{column}_ci_high": high}
            means[arm] = stats
        raise_along = means.get("raise", {}).get("along_push", math.nan)
        null_distance = means.get("null", {}).get("distance", math.nan)
        for arm, stats in means.items():
            ratio = stats["along_push"] / raise_along if raise_along else math.nan
            rows.append(
                {
                    "base": base,
                    "arm": arm,
                    "unit": UNIT,
                    "n": int((part["arm"] == arm).sum()),
                    **stats,
                    "along_push_vs_raise": ratio,
                    "matched": bool(abs(ratio - 1) <= MATCH_TOLERANCE)
                    if arm in ("sham", "geometry") and np.isfinite(ratio)
                    else None,
                    "distance_vs_null": stats["distance"] / null_distance
                    if null_distance
                    else math.nan,
                }
            )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- per unit of JER


def binding_per_jer(
    arms: pd.DataFrame,
    arm: str = "raise",
    n_boot: int = 4000,
    *,
    seed: int,
    confidence: float,
) -> pd.DataFrame:
    """Per base: the ``arm``'s binding change per unit of top-k JER change against plain, the
    ratio of the mean per-seed differences, with a percentile interval over seed resamples
    (``n_boot`` seeded draws; a resample whose mean JER change is 0 is skipped)."""
    rows = []
    for base, part in arms.groupby("base", sort=False):
        pair = {}
        for metric in ("binding", "jer"):
            a = part[part["arm"] == arm].set_index("seed")[metric]
            b = part[part["arm"] == "plain"].set_index("seed")[metric]
            seeds = sorted(set(a.index) & set(b.index))
            pair[metric] = np.array([a[s] - b[s] for s in seeds], dtype=float)
        d_binding, d_jer = pair["binding"], pair["jer"]
        n = len(d_jer)
        estimate = float(d_binding.mean() / d_jer.mean()) if n and d_jer.mean() else math.nan
        rng = np.random.default_rng(seed)
        draws = rng.integers(0, n, size=(n_boot, n)) if n else np.zeros((0, 0), int)
        jer_means = d_jer[draws].mean(1) if n else np.array([])
        valid = jer_means != 0
        ratios = d_binding[draws][valid].mean(1) / jer_means[valid] if n else np.array([])
        alpha = (1 - confidence) / 2
        low, high = (
            (float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1 - alpha)))
            if len(ratios)
            else (math.nan, math.nan)
        )
        rows.append(
            {
                "base": base,
                "arm": arm,
                "unit": UNIT,
                "n": n,
                "binding_per_jer": estimate,
                "ci_low": low,
                "ci_high": high,
                "binding_change": float(d_binding.mean()) if n else math.nan,
                "jer_change": float(d_jer.mean()) if n else math.nan,
                "n_boot": n_boot,
                "confidence": confidence,
            }
        )
    return pd.DataFrame(rows)


def plain_associations(
    arms: pd.DataFrame, confidence: float, n_boot: int, seed: int
) -> pd.DataFrame:
    """Per base: across its plain runs (one dose, seeds as units), Pearson r of binding with
    top-k JER and with G.PR, with bootstrap intervals over the runs, the t p and the
    permutation p (:func:`repdiag.common.statistics.correlation`): the observational association
    where the dose is held fixed."""
    from repdiag.common.statistics import correlation

    rows = []
    for base, part in arms[arms["arm"] == "plain"].groupby("base", sort=False):
        units = Units.of(part, "model", "seed")
        for metric in ("jer", "g_pr"):
            result = correlation(
                part[metric].to_numpy(float),
                part["binding"].to_numpy(float),
                units=units,
                n_boot=n_boot,
                seed=seed,
                confidence=confidence,
                min_models=4,
            )
            rows.append(
                {
                    "base": base,
                    "metric": metric,
                    "unit": UNIT,
                    "n": result.n,
                    "pearson_r": result.pearson_r,
                    "ci_low": result.pearson_ci_low,
                    "ci_high": result.pearson_ci_high,
                    "p": result.pearson_p,
                    "p_exact": result.pearson_p_exact,
                    "note": result.note,
                }
            )
    return pd.DataFrame(rows)

"""The paper comparison: each claim of ``repdiag/binding/claims.yaml`` beside this run's value,
and the depth-collapse rule that the two "depth of JER collapse" claims read."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding.analysis.options import StatsSettings
from repdiag.binding.analysis.units import TRAINED, UNIT
from repdiag.common.claims import study_claims
from repdiag.common.exact import format_permutation_p
from repdiag.core.errors import StoreError

DROP_COLUMNS = ("drop_mean", "drop_ci_low", "drop_ci_high")


@dataclass(frozen=True)
class Collapse:
    """Where JER collapses: the layer after the drop, its depth and the drop's size."""

    layer: str
    relative_depth: float
    relative_drop: float  # (JER_{l-1} - JER_l) / JER_{l-1}, of the layer means
    drop_mean: float  # mean over images of JER_{l-1}(x) - JER_l(x)
    drop_ci_low: float  # paired t-interval of that mean
    drop_ci_high: float

    def text(self, model: str, confidence: float) -> str:
        return (
            f"{model}: {self.layer} (depth {self.relative_depth:.2f}, -{self.relative_drop:.0%}, "
            f"drop {confidence:.0%} CI [{self.drop_ci_low:.3g}, {self.drop_ci_high:.3g}])"
        )


def collapse_layer(profile: pd.DataFrame, threshold: float = 0.2) -> Collapse | None:
    """The layer after the largest JER drop that is both large and real, else None.

    A drop between consecutive layers counts only when the layer mean falls by more than
    ``threshold`` of the earlier value AND the paired per-image interval of the drop
    (``drop_ci_low``, from :func:`depth_table`) lies above 0. ``profile``: one model, formula
    and probe set of the depth table. A flat or noisy profile, a small drop, or a large mean drop
    that only a few images carry gives None ("no collapse").
    """
    missing = [
        c
        for c in ("layer", "layer_index", "relative_depth", "jer_mean", *DROP_COLUMNS)
        if c not in profile
    ]
    if missing:
        raise StoreError(
            f"the depth table has no column {', '.join(missing)}: it predates the collapse rule; "
            "rerun aggregate_models"
        )
    profile = profile.sort_values("layer_index")
    jer = profile["jer_mean"].to_numpy(float)
    if len(jer) < 2:
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = np.where(jer[:-1] > 0, (jer[:-1] - jer[1:]) / jer[:-1], np.nan)
    low = profile["drop_ci_low"].to_numpy(float)[1:]
    real = np.isfinite(relative) & (relative > threshold) & np.isfinite(low) & (low > 0)
    if not real.any():
        return None
    i = int(np.nanargmax(np.where(real, relative, np.nan))) + 1
    row = profile.iloc[i]
    return Collapse(
        layer=str(row["layer"]),
        relative_depth=float(row["relative_depth"]),
        relative_drop=float(relative[i - 1]),
        drop_mean=float(row["drop_mean"]),
        drop_ci_low=float(row["drop_ci_low"]),
        drop_ci_high=float(row["drop_ci_high"]),
    )


def _collapse_text(
    depth: pd.DataFrame, table: pd.DataFrame, families: Iterable[str], settings: StatsSettings
) -> tuple[str, int]:
    chosen = table[table["family"].isin(list(families))]["model"].tolist()
    parts = []
    for model in chosen:
        part = depth[
            (depth["model"] == model)
            & (depth["formula"] == settings.jer_formula)
            & (depth["probe_set"] == settings.probe_set)
        ]
        found = collapse_layer(part, settings.collapse_threshold)
        parts.append(
            f"{model}: no collapse" if found is None else found.text(model, settings.confidence)
        )
    return "; ".join(parts), len(chosen)


def _family_mean(table: pd.DataFrame, families: Sequence[str], column: str) -> tuple[float, int]:
    values = table.loc[table["family"].isin(families), column].to_numpy(float)
    values = values[np.isfinite(values)]
    return (float(values.mean()) if values.size else math.nan), int(values.size)


def _row(table: pd.DataFrame, column: str, key: str) -> pd.Series | None:
    rows = table[table[column] == key] if column in table else table.iloc[0:0]
    return rows.iloc[0] if len(rows) else None


class ClaimRows:
    """The comparison's rows, keyed by claim id: :meth:`add` fills one from the claim and the run."""

    def __init__(self, claims: Any) -> None:
        self.claims = claims
        self.rows: dict[str, dict[str, Any]] = {}

    def add(
        self,
        claim_id: str,
        run_value: float,
        run_text: str,
        n_models: int,
        note: str = "",
        **fmt: str,
    ) -> None:
        claim = self.claims[claim_id]
        holds = claim.holds([run_value]) if math.isfinite(run_value) else None
        self.rows[claim_id] = {
            "claim_id": claim_id,
            "claim": claim.statement.format(**fmt) if fmt else claim.statement,
            "paper_value": claim.value,
            "paper_text": claim.paper_text,
            "run_value": run_value,
            "run_text": run_text,
            "n_models": n_models,
            "holds": holds,
            "note": note,
        }


def paper_comparison(
    table: pd.DataFrame,
    tables: Mapping[str, Any],
    settings: StatsSettings,
    *,
    depth: pd.DataFrame,
    runs: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Each claim of ``repdiag/binding/claims.yaml`` beside this run's value.

    One row per claim: its id and statement, the paper's value and text, the run's value, text
    and number of units (``n_models``), ``holds`` where the claim has a band (every other claim
    is compared by eye: the paper's JER scale is that of 224-pixel ViTs with k = 32) and a note.
    ``table`` has one row per unit (an objective, its seeds averaged); ``runs`` one per trained
    network, read by the per-model depth claims (``table`` when None).
    """
    runs = table if runs is None else runs
    claims = study_claims("binding")
    found = ClaimRows(claims)
    add = found.add
    corr = tables["correlations"]
    add_correlation_claims(add, corr, "jer", "jer_binding_r", "jer_binding_p")
    add_fit_claim(add, tables["ols"])
    add_correlation_claims(add, corr, "g_iso", "g_iso_binding_r", "g_iso_binding_p")
    add_geometry_claim(add, tables["robustness"], settings, len(table))
    add_family_claims(add, claims, table)
    for claim_id in ("collapse_depth_clip_dinov2", "collapse_depth_mae"):
        text, k = _collapse_text(depth, runs, claims[claim_id].where["families"], settings)
        add(claim_id, math.nan, text or "no such model", k)
    value, k = _low_jer_readout_gain(table)
    add("readout_gain_low_jer", value, f"{value:+.1%}", k)
    add_partial_claim(add, tables["partial"], settings)
    n = len(table)
    n_runs = int(table["n_runs"].sum()) if "n_runs" in table else n
    text = f"{n} units ({n_runs} training runs), {table['family'].nunique()} families"
    add("n_models", n, text, n, "unit: objective (mean over its seeds)")
    # the partial correlation needs a covariate in the config; every other claim is evaluated
    unevaluated = set(claims.ids) - set(found.rows) - {"partial_jer_binding"}
    if unevaluated:
        raise KeyError(f"claims the binding report cannot evaluate: {sorted(unevaluated)}")
    return pd.DataFrame([found.rows[claim_id] for claim_id in claims.ids if claim_id in found.rows])


def add_correlation_claims(
    add: Any, corr: pd.DataFrame, metric: str, r_claim: str, p_claim: str
) -> None:
    """Pearson r of ``metric`` with binding and its p-value, from the correlations table's rows
    over the families' units (``models`` = ``trained``: objectives, seeds averaged)."""
    models = corr["models"] if "models" in corr else pd.Series(TRAINED, index=corr.index)
    row = _row(corr[models == TRAINED], "metric", metric)
    if row is None:
        r, p, k, note = math.nan, math.nan, 0, f"{metric} not measured"
    else:
        r, p, k = float(row["pearson_r"]), float(row["pearson_p"]), int(row["n"])
        runs = int(row["n_runs"]) if "n_runs" in row and np.isfinite(row["n_runs"]) else k
        unit = str(row.get("unit", UNIT))
        note = f"unit: {unit}, n = {k} units ({runs} training runs). {row['note'] or ''}".strip()
        exact = float(row.get("pearson_p_exact", math.nan))
        if math.isfinite(exact):  # up to 10 units: the permutation p beside the t p
            shown = format_permutation_p(exact, k, row.get("n_permutations"))
            note = f"{note} Permutation p of r = {shown}.".strip()
    add(r_claim, r, f"r = {r:.3f}", k, note)
    add(p_claim, p, f"p = {p:.3g}", k, note)


def add_fit_claim(add: Any, ols: pd.DataFrame) -> None:
    """R^2 of the paper's bivariate fit ``binding ~ jer + same_different``."""
    bivariate = ols[ols["formula"] == "binding ~ jer + same_different"]
    if len(bivariate):
        fit = bivariate.iloc[0]
        r2, n_fit, fit_note = float(fit["r2"]), int(fit["n"]), str(fit["note"] or "")
        fit_note = f"unit: {fit.get('unit', UNIT)}, n = {n_fit} units. {fit_note}".strip()
    else:
        r2, n_fit, fit_note = math.nan, 0, ""
    add("jer_same_different_r2", r2, f"R^2 = {r2:.3f}", n_fit, fit_note)


def add_family_claims(add: Any, claims: Any, table: pd.DataFrame) -> None:
    """Mean JER and binding of the families the paper singles out."""
    for kind in ("variance_decorrelation", "clip_dinov2", "supervised"):
        for column in ("jer", "binding"):
            claim_id = f"{column}_{kind}"
            if claim_id not in claims.ids:
                continue
            families = claims[claim_id].where["families"]
            value, k = _family_mean(table, families, column)
            note = "" if k else f"no model of family {', '.join(families)} in this run"
            text = f"JER {value:.2f}" if column == "jer" else f"{value:.1%}"
            add(claim_id, value, text, k, note)


def add_partial_claim(add: Any, partial: pd.DataFrame, settings: StatsSettings) -> None:
    """The partial correlation of JER with binding given the first configured covariate."""
    controlled = partial[partial["controls"].isin(settings.covariates)]
    if len(controlled):
        row = controlled.iloc[0]
        r, note = float(row["r"]), str(row["note"] or "")
        add(
            "partial_jer_binding",
            r,
            f"r = {r:.3f}, p = {float(row['p']):.3g}",
            int(row["n"]),
            f"different benchmark from the paper's (SugarCrepe). {note}".strip(),
            covariate=str(row["controls"]),
        )


def add_geometry_claim(add: Any, robust: pd.DataFrame, settings: StatsSettings, n: int) -> None:
    """The largest |r| with binding over every geometry variant (L.Iso k, ER and PR, G.Iso)."""
    geometry = robust[
        robust["group"].isin(["l_iso", "geometry_rank", "g_iso"])
        & (robust["target"] == settings.binding_column)
    ]
    abs_r = geometry["pearson_r"].abs().to_numpy(float) if len(geometry) else np.array([])
    if np.isfinite(abs_r).any():
        index = int(np.nanargmax(abs_r))
        worst, metric = float(abs_r[index]), str(geometry.iloc[index]["metric"])
    else:
        worst, metric = math.nan, "none"
    note = "" if math.isfinite(worst) else "no geometry correlation could be computed"
    add("geometry_max_abs_r", worst, f"max |r| = {worst:.3f} ({metric})", n, note)


def _low_jer_readout_gain(table: pd.DataFrame) -> tuple[float, int]:
    """Mean of max(kNN, local PCA) - cosine binding over the models with JER <= the median."""
    low_jer = table[table["jer"] <= table["jer"].median()]
    needed = {"binding_knn", "binding_local_pca", "binding_cosine"}
    if not needed <= set(table.columns) or not len(low_jer):
        return math.nan, len(low_jer)
    gain = np.fmax(low_jer["binding_knn"], low_jer["binding_local_pca"]) - low_jer["binding_cosine"]
    return (float(np.nanmean(gain)) if np.isfinite(gain).any() else math.nan), len(low_jer)

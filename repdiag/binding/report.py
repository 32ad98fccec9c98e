"""From per-model results to the study's tables: aggregation, statistics, paper comparison, digest.

``aggregate`` joins ``results/metrics/<model>.json`` (geometry, binding per readout,
Same/Different at the final layer), ``results/jacobians/<model>.zarr`` (JER per layer, singular
value spectra) and each model's config entry (family, source, covariates) into one row per model.
``statistics_tables`` turns that table into every table of the analysis with :mod:`repdiag.binding.stats`;
``paper_comparison`` sets each headline number of the binding paper beside this run's value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding import APART_FAMILIES, CONTROL_FAMILY, JER_INTERVENTION_FAMILY, stats
from repdiag.binding.dose import dose_correlations, dose_markdown
from repdiag.binding.jacobian_options import STORE_CONTRACT
from repdiag.binding.stats_options import (
    GEOMETRY,
    JER_FORMULAS,
    JER_SUMMARIES,
    READOUTS,
    StatsSettings,
    check_stats_config,
    covariate_columns,
)
from repdiag.common.claims import study_claims
from repdiag.common.intervals import mean_interval
from repdiag.common.tables import format_number as _fmt
from repdiag.common.tables import markdown_table
from repdiag.core.errors import ConfigError, StoreError
from repdiag.core.store import open_store, read_json
from repdiag.encoders.zoo.spec import binding_dose

__all__ = [
    "READOUTS",
    "Aggregate",
    "StatsSettings",
    "aggregate",
    "check_stats_config",
    "depth_table",
    "headline_metrics",
    "metric_label",
    "normalised_spectra",
    "paper_comparison",
    "read_table",
    "robustness_variants",
    "statistics_tables",
    "summary_markdown",
    "zoo_curves",
]


LABELS = {
    "g_pr": "G.PR",
    "g_iso": "G.Iso",
    "effective_rank": "effective rank",
    "participation_ratio": "participation ratio",
    "jer": "JER",
    "same_different": "Same/Different accuracy",
    "binding": "binding accuracy",
}


def metric_label(column: str) -> str:
    """Human name of a models-table column (``l_iso_k10`` -> ``L.Iso (k=10)``)."""
    if column in LABELS:
        return LABELS[column]
    if match := re.fullmatch(r"l_iso_k(\d+)", column):
        return f"L.Iso (k={match.group(1)})"
    if match := re.fullmatch(r"jer_(\w+?)_(final|max)", column):
        return f"JER {match.group(1)} ({match.group(2)})"
    if match := re.fullmatch(r"binding_(\w+)", column):
        return f"binding accuracy ({match.group(1)})"
    return column


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a table written by :func:`repdiag.common.tables.write_csv`; a missing file names the rule to rerun."""
    path = Path(path)
    if not path.is_file():
        raise StoreError(f"table {path} does not exist: run the workflow rule that produces it")
    frame = pd.read_csv(path)
    for column in ("note", "run_text", "paper_text", "controls"):
        if column in frame:
            frame[column] = frame[column].astype(object).fillna("").astype(str)
    return frame


# --------------------------------------------------------------------------- aggregation


def _number(value: Any) -> float:
    """A JSON number as float; null or absent -> NaN."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


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
        "chance": _number(metrics.get("chance")),
        **{name: _number(sizes.get(name)) for name in ("n_queries", "n_candidates", "n_pairs")},
    }
    for name in GEOMETRY:
        row[name] = _number(geometry.get(name))
    for k in sorted(geometry.get("l_iso", {}), key=lambda k: int(k)):
        row[f"l_iso_k{int(k)}"] = _number(geometry["l_iso"][k])
    binding = layer.get("binding", {})
    notes = []
    for readout in READOUTS:
        result = binding.get(readout) or {}
        row[f"binding_{readout}"] = _number(result.get("accuracy"))
        row[f"binding_{readout}_ci_low"] = _number(result.get("ci_low"))
        row[f"binding_{readout}_ci_high"] = _number(result.get("ci_high"))
        if result.get("skipped"):  # a readout that cannot apply to the layer: NaN plus its note
            notes.append(f"binding_{readout}: {result.get('note') or 'skipped'}")
    row["note"] = "; ".join(notes)
    probe = layer.get("same_different", {})
    row["same_different"] = _number(probe.get("accuracy"))
    row["same_different_ci_low"] = _number(probe.get("ci_low"))
    row["same_different_ci_high"] = _number(probe.get("ci_high"))
    return row


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
    ds: Any, model: str, family: str, *, path: str | Path = "", confidence: float = 0.95
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


@dataclass
class Aggregate:
    """The aggregation's three tables."""

    models: pd.DataFrame
    depth: pd.DataFrame
    spectra: pd.DataFrame = field(default_factory=pd.DataFrame)


ZOO_COLUMNS = ("learned", "slot_probe_gain", "dose", "step", "seed")


def dose_of(meta: Mapping[str, Any]) -> float:
    """The binding dose lambda of a zoo run (its slot-label weight beside presence labels): 0 for
    a presence-supervised run told no slots, NaN for every run outside the dose series (other
    labels or objectives, the random-initialised control, JER-regularised runs)."""
    hparams = meta.get("hparams") or {}
    if meta.get("objective") != "supervised" or hparams.get("label") != "shape_presence":
        return math.nan
    if meta.get("family") in (CONTROL_FAMILY, JER_INTERVENTION_FAMILY):
        return math.nan  # steps: 0 is a control; a regularised run is binding_causal's, not a dose
    return binding_dose(str(meta["objective"]), hparams)


def learning_columns(meta_path: str | Path | None) -> dict[str, Any]:
    """``learned`` and the probe gain of a zoo run's ``meta.json`` (``learning``), its binding
    dose, the steps it trained and its seed; NaN for models the workflow did not train."""
    if meta_path is None:
        return dict.fromkeys(ZOO_COLUMNS, math.nan)
    meta = read_json(meta_path)
    learning = meta.get("learning")
    if not isinstance(learning, Mapping) or "left_plateau" not in learning:
        raise StoreError(f"{meta_path}: no 'learning' record; rerun train_zoo for this run")
    return {
        "learned": float(bool(learning["left_plateau"])),
        "slot_probe_gain": _number(learning.get("slot_probe_gain")),
        "dose": dose_of(meta),
        "step": _number(meta.get("steps_trained", meta.get("steps"))),
        "seed": _number(meta.get("seed")),
    }


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
        row |= learning_columns((zoo_meta_paths or {}).get(key))
        for name in covariates:
            row[name] = _number(entry.get("covariates", {}).get(name))
        rows.append(row)
        depths.append(profile)
        spectra.append(normalised_spectra(ds, key, family, settings.probe_set, path=path))
    table = pd.DataFrame(rows)
    if table.empty:
        raise ConfigError("config.models is empty: there is nothing to aggregate")
    table["jer"] = table[settings.jer_column]
    table["binding"] = table[settings.binding_column]
    return Aggregate(
        models=table,
        depth=pd.concat(depths, ignore_index=True),
        spectra=pd.concat(spectra, ignore_index=True),
    )


# --------------------------------------------------------------------------- statistics


def headline_metrics(table: pd.DataFrame, settings: StatsSettings) -> list[str]:
    """Columns correlated with binding in correlations.csv, in reading order."""
    columns = [
        "g_pr",
        "g_iso",
        *stats.l_iso_columns(table),
        "effective_rank",
        "participation_ratio",
    ]
    columns += ["jer", "same_different", *settings.covariates]
    return [c for c in columns if c in table.columns]


def robustness_variants(table: pd.DataFrame) -> list[dict[str, str]]:
    """Every L.Iso k, geometry rank formulation and JER formulation/summary in the table."""
    variants = [
        {"group": "l_iso", "variant": f"k={c[7:]}", "metric": c} for c in stats.l_iso_columns(table)
    ]
    variants += [
        {"group": "geometry_rank", "variant": "G.PR (participation ratio / D)", "metric": "g_pr"},
        {
            "group": "geometry_rank",
            "variant": "participation ratio",
            "metric": "participation_ratio",
        },
        {
            "group": "geometry_rank",
            "variant": "effective rank (exp-entropy)",
            "metric": "effective_rank",
        },
        {"group": "g_iso", "variant": "G.Iso", "metric": "g_iso"},
    ]
    for formula in JER_FORMULAS:
        for at in JER_SUMMARIES:
            variants.append(
                {
                    "group": "jer_rank",
                    "variant": f"{formula} ({at})",
                    "metric": f"jer_{formula}_{at}",
                }
            )
    return [v for v in variants if v["metric"] in table.columns]


FAMILY_METRICS = (
    "binding_cosine",
    "binding_knn",
    "binding_local_pca",
    "same_different",
    "jer",
    "g_pr",
    "g_iso",
    "effective_rank",
)


def ols_fits(table: pd.DataFrame, settings: StatsSettings) -> list[stats.OLSFit]:
    """The paper's bivariate fit, its univariate parts, a geometry fit, and one with covariates."""
    predictor_sets = [["jer", "same_different"], ["jer"], ["same_different"], ["g_iso"]]
    if settings.covariates:
        predictor_sets.append(["jer", "same_different", *settings.covariates])
    kwargs = {"confidence": settings.confidence, "min_models": settings.min_models}
    return [stats.fit_ols(table, "binding", p, **kwargs) for p in predictor_sets]


TRAINED = "trained"
LEARNED = "trained, learned"
WITH_CONTROLS = "trained + controls"


def learned_models(table: pd.DataFrame) -> pd.DataFrame:
    """The models whose zoo run passed its learning check, plus every model not trained by the
    workflow (``learned`` NaN: pretrained weights, nothing to check)."""
    if "learned" not in table:
        return table
    flags = table["learned"].to_numpy(float)
    return table[~(flags == 0.0)].reset_index(drop=True)


def trained_models(table: pd.DataFrame) -> pd.DataFrame:
    """The models of an objective family (not controls, not told the binding): the population of
    every correlation and fit."""
    return table[~table["family"].isin(APART_FAMILIES)].reset_index(drop=True)


def statistics_tables(
    table: pd.DataFrame, depth: pd.DataFrame, settings: StatsSettings
) -> dict[str, pd.DataFrame | str]:
    """Every table of the analysis, keyed by output name (``correlations``, ``ols``, ...).

    Correlations, fits, partial correlations, robustness and the paper comparison are over the
    trained models only; ``correlations`` repeats every metric over trained models and controls
    (``models`` column), and ``families`` lists the controls as a family of their own."""
    options = settings.options()
    everything, table = table, trained_models(table)
    n = len(table)
    correlations = stats.correlation_table(
        table, "binding", headline_metrics(table, settings), **options
    )
    correlations.insert(0, "models", TRAINED)
    learned = learned_models(table)
    if 0 < len(learned) < n:
        only_learned = stats.correlation_table(
            learned, "binding", headline_metrics(learned, settings), **options
        )
        only_learned.insert(0, "models", LEARNED)
        correlations = pd.concat([correlations, only_learned], ignore_index=True)
    if len(everything) > n:
        with_controls = stats.correlation_table(
            everything, "binding", headline_metrics(everything, settings), **options
        )
        with_controls.insert(0, "models", WITH_CONTROLS)
        correlations = pd.concat([correlations, with_controls], ignore_index=True)
    fits = ols_fits(table, settings)
    control_sets = [["same_different"]] + [[c] for c in settings.covariates]
    if len(settings.covariates) > 1:
        control_sets.append(list(settings.covariates))
    partial = stats.partial_table(table, "jer", "binding", control_sets, **options)
    families = stats.family_table(
        everything,
        [m for m in FAMILY_METRICS if m in everything.columns],
        confidence=settings.confidence,
    )
    robustness = stats.robustness_table(
        table,
        robustness_variants(table),
        [f"binding_{r}" for r in READOUTS],
        **options,
    )
    tables: dict[str, pd.DataFrame | str] = {
        "correlations": correlations,
        "ols": stats.ols_table(fits),
        "ols_summary": stats.ols_summary_text(fits),
        "partial": partial,
        "families": families,
        "robustness": robustness,
        "dose_series": dose_correlations(everything, options),
    }
    tables["paper_comparison"] = paper_comparison(table, depth, tables, settings)
    if n < settings.min_models:
        note = stats.too_few_note(n, settings.min_models, "the statistics")
        comparison = tables["paper_comparison"]
        assert isinstance(comparison, pd.DataFrame)
        comparison["note"] = [
            old if "too few models" in old else f"{note}. {old}".strip()
            for old in comparison["note"].fillna("").astype(str)
        ]
        tables["ols_summary"] = f"NOTE: {note}.\n\n{tables['ols_summary']}"
    return tables


# --------------------------------------------------------------------------- paper comparison


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

    def text(self, model: str, confidence: float = 0.95) -> str:
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


def paper_comparison(
    table: pd.DataFrame,
    depth: pd.DataFrame,
    tables: Mapping[str, Any],
    settings: StatsSettings,
) -> pd.DataFrame:
    """Each claim of ``repdiag/binding/claims.yaml`` beside this run's value.

    One row per claim: its id and statement, the paper's value and text, the run's value, text
    and number of models, ``holds`` where the claim has a band (every other claim is compared by
    eye: the paper's JER scale is that of 224-pixel ViTs with k = 32) and a note.
    """
    claims = study_claims("binding")
    corr = tables["correlations"]
    rows: dict[str, dict[str, Any]] = {}

    def add(
        claim_id: str, run_value: float, run_text: str, n_models: int, note: str = "", **fmt: str
    ) -> None:
        claim = claims[claim_id]
        holds = claim.holds([run_value]) if math.isfinite(run_value) else None
        rows[claim_id] = {
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

    def add_correlation(metric: str, r_claim: str, p_claim: str) -> None:
        row = _row(corr, "metric", metric)
        if row is None:
            r, p, k, note = math.nan, math.nan, 0, f"{metric} not measured"
        else:
            r, p, k = float(row["pearson_r"]), float(row["pearson_p"]), int(row["n"])
            note = str(row["note"] or "")
        add(r_claim, r, f"r = {r:.3f}", k, note)
        add(p_claim, p, f"p = {p:.3g}", k, note)

    add_correlation("jer", "jer_binding_r", "jer_binding_p")
    ols = tables["ols"]
    bivariate = ols[ols["formula"] == "binding ~ jer + same_different"]
    if len(bivariate):
        fit = bivariate.iloc[0]
        r2, n_fit, fit_note = float(fit["r2"]), int(fit["n"]), str(fit["note"] or "")
    else:
        r2, n_fit, fit_note = math.nan, 0, ""
    add("jer_same_different_r2", r2, f"R^2 = {r2:.3f}", n_fit, fit_note)
    add_correlation("g_iso", "g_iso_binding_r", "g_iso_binding_p")
    add_geometry_claim(add, tables["robustness"], settings, len(table))

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

    for claim_id in ("collapse_depth_clip_dinov2", "collapse_depth_mae"):
        text, k = _collapse_text(depth, table, claims[claim_id].where["families"], settings)
        add(claim_id, math.nan, text or "no such model", k)

    value, k = _low_jer_readout_gain(table)
    add("readout_gain_low_jer", value, f"{value:+.1%}", k)

    partial = tables["partial"]
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
    n = len(table)
    add("n_models", n, f"{n} models, {table['family'].nunique()} families", n)
    # the partial correlation needs a covariate in the config; every other claim is evaluated
    unevaluated = set(claims.ids) - set(rows) - {"partial_jer_binding"}
    if unevaluated:
        raise KeyError(f"claims the binding report cannot evaluate: {sorted(unevaluated)}")
    return pd.DataFrame([rows[claim_id] for claim_id in claims.ids if claim_id in rows])


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


# --------------------------------------------------------------------------- zoo and digest


def zoo_curves(paths: Iterable[str | Path]) -> pd.DataFrame:
    """``results/zoo/<objective>/curve.csv`` files (step, loss) as one long table."""
    frames = []
    for path in paths:
        path = Path(path)
        frame = pd.read_csv(path)
        stats.require_columns(frame, ["step", "loss"], f"zoo curve {path}")
        frames.append(frame.assign(objective=path.parent.name)[["objective", "step", "loss"]])
    return (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame(columns=["objective", "step", "loss"])
    )


def _with_interval(row: pd.Series, column: str) -> str:
    value = row.get(column, math.nan)
    low, high = row.get(f"{column}_ci_low", math.nan), row.get(f"{column}_ci_high", math.nan)
    if not np.isfinite(float(value)):
        return "n/a"
    if not (np.isfinite(float(low)) and np.isfinite(float(high))):
        return f"{value:.3f}"
    return f"{value:.3f} [{low:.2f}, {high:.2f}]"


def model_results(
    table: pd.DataFrame, depth: pd.DataFrame, settings: StatsSettings
) -> pd.DataFrame:
    """One row per model and control, formatted for reading: the learning check, binding for
    every readout and Same/Different with their intervals, JER at the final tap and at every tap
    (mean over the probe images, ``settings.jer_formula`` on ``settings.probe_set``), G.PR,
    G.Iso and the smallest-k L.Iso."""
    profile = depth[
        (depth["formula"] == settings.jer_formula) & (depth["probe_set"] == settings.probe_set)
    ]
    l_iso = stats.l_iso_columns(table)
    rows = []
    for _, row in table.iterrows():
        layers = profile[profile["model"] == row["model"]].sort_values("layer_index")
        learned = row.get("learned", math.nan)
        rows.append(
            {
                "model": row["model"],
                "family": row["family"],
                "learned": "" if pd.isna(learned) else ("yes" if learned else "**no**"),
                **{
                    f"binding {readout}": _with_interval(row, f"binding_{readout}")
                    for readout in READOUTS
                },
                "Same/Different": _with_interval(row, "same_different"),
                "JER final": _fmt(row.get("jer", math.nan), ".1f"),
                "JER by tap": " → ".join(_fmt(v, ".1f") for v in layers["jer_mean"]) or "n/a",
                "G.PR": _fmt(row.get("g_pr", math.nan)),
                "G.Iso": _fmt(row.get("g_iso", math.nan), ".2f"),
                **({metric_label(l_iso[0]): _fmt(row[l_iso[0]], ".2f")} if l_iso else {}),
            }
        )
    return pd.DataFrame(rows)


def summary_markdown(
    table: pd.DataFrame,
    tables: Mapping[str, Any],
    settings: StatsSettings,
    zoo: pd.DataFrame | None = None,
) -> str:
    """``results/summary.md``: the headline numbers of this run, generated from the tables."""
    everything, table = table, trained_models(table)
    controls = everything[everything["family"].isin(APART_FAMILIES)]
    n = len(table)
    all_corr = tables["correlations"]
    models_column = all_corr.get("models", pd.Series(TRAINED, index=all_corr.index))
    corr = all_corr[models_column == TRAINED]
    ols = tables["ols"]
    lines = [
        "# repdiag binding study: summary",
        "",
        f"{n} trained models in {table['family'].nunique()} families and {len(controls)} controls, "
        "binding-supervised upper bounds or dose-series runs (kept out of every correlation and "
        "fit across families); binding "
        f"readout `{settings.readout}`, "
        f"JER formula `{settings.jer_formula}` at the `{settings.jer_at}` layer on the "
        f"`{settings.probe_set}` probe images; {settings.n_bootstrap} bootstrap resamples of models, "
        f"seed {settings.seed}, {settings.confidence:.0%} intervals.",
        "",
    ]
    if n < settings.min_models:
        lines += [f"**Note:** {stats.too_few_note(n, settings.min_models, 'the statistics')}.", ""]
    if "learned" in table and table["learned"].notna().any():
        checked = table[table["learned"].notna()]
        failed = checked.loc[checked["learned"] == 0, "model"].tolist()
        lines += [
            f"Learning check (zoo runs, repdiag.encoders.zoo.learning): "
            f"{len(checked) - len(failed)} of {len(checked)} trained runs learned"
            + (f"; not learned: {', '.join(failed)}." if failed else "."),
            "",
        ]
    jer = corr[corr["metric"] == "jer"]
    if len(jer):
        row = jer.iloc[0]
        lines.append(
            f"- JER vs binding: Pearson r = {_fmt(row['pearson_r'])} (p = {_fmt(row['pearson_p'], '.3g')}, "
            f"{settings.confidence:.0%} CI [{_fmt(row['pearson_ci_low'])}, {_fmt(row['pearson_ci_high'])}]), "
            f"Spearman rho = {_fmt(row['spearman_rho'])}. {row['note'] or ''}".rstrip()
        )
    for models, label in (
        (LEARNED, "the runs that learned"),
        (WITH_CONTROLS, "trained models and controls"),
    ):
        other = all_corr[(models_column == models) & (all_corr["metric"] == "jer")]
        if len(other):
            row = other.iloc[0]
            lines.append(
                f"- The same over {label} (n = {int(row['n'])}): r = {_fmt(row['pearson_r'])}, "
                f"{settings.confidence:.0%} CI [{_fmt(row['pearson_ci_low'])}, "
                f"{_fmt(row['pearson_ci_high'])}]."
            )
    fit = ols[ols["formula"] == "binding ~ jer + same_different"]
    if len(fit):
        lines.append(
            f"- OLS binding ~ JER + Same/Different: R^2 = {_fmt(fit['r2'].iloc[0])}, adjusted "
            f"R^2 = {_fmt(fit['adj_r2'].iloc[0])} (n = {int(fit['n'].iloc[0])}). {fit['note'].iloc[0] or ''}".rstrip()
        )
    geometry = corr[corr["metric"].isin(["g_pr", "g_iso", *stats.l_iso_columns(table)])]
    if len(geometry):
        parts = [
            f"{metric_label(m)} r = {_fmt(r)}"
            for m, r in zip(geometry["metric"], geometry["pearson_r"], strict=True)
        ]
        lines.append("- Geometry vs binding: " + ", ".join(parts) + ".")
    if "dose_series" in tables:
        lines += [""]
        lines += dose_markdown(
            everything, tables["dose_series"], settings.binding_column, settings.confidence
        )
        lines.pop()
    lines += ["", "## Paper comparison", ""]
    comparison = tables["paper_comparison"][["claim", "paper_text", "run_text", "n_models"]]
    lines += [markdown_table(comparison), ""]
    lines += ["## Models (final layer)", ""]
    columns = [
        c
        for c in (
            "model",
            "family",
            "binding",
            "binding_knn",
            "binding_local_pca",
            "same_different",
            "jer",
            "g_pr",
            "g_iso",
            "learned",
        )
        if c in table
    ]
    lines += [markdown_table(table[columns]), ""]
    if len(controls):
        lines += ["## Controls and upper bounds (final layer; not in any fit)", ""]
        lines += [markdown_table(controls[columns]), ""]
    if "depth_profiles" in tables:
        lines += [
            f"## Every model and control ({settings.confidence:.0%} intervals; JER by tap from "
            "the first tap to the last)",
            "",
            markdown_table(model_results(everything, tables["depth_profiles"], settings)),
            "",
        ]
    if zoo is not None and len(zoo):
        last = (
            zoo.sort_values("step")
            .groupby("objective")
            .agg(steps=("step", "max"), first_loss=("loss", "first"), final_loss=("loss", "last"))
            .reset_index()
        )
        lines += [
            "## Zoo training (results/zoo/<objective>/curve.csv)",
            "",
            markdown_table(last, ".4g"),
            "",
        ]
    lines += [
        "## Files",
        "",
        "Tables in `results/tables/` (models, correlations, ols, ols_summary.txt, partial, families, "
        "robustness, dose_series, paper_comparison, depth_profiles, spectra); figures in `results/figures/` "
        "(metric_scatter, jacobian_spectra, depth_profiles, readouts); the HTML report is built with "
        "`snakemake --report results/report.html`.",
        "",
    ]
    return "\n".join(lines)

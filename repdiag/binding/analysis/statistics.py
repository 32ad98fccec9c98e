"""Every table of the binding analysis across models (``statistics_tables``): correlations with
binding, OLS fits, partial correlations, family means, robustness over metric variants, the dose
series and the paper comparison, computed with :mod:`repdiag.common.statistics`.

Correlations, fits, partial correlations and robustness are over the trained models only (not
the controls, binding-supervised upper bounds or dose-series runs: ``APART_FAMILIES``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding import APART_FAMILIES
from repdiag.binding.analysis.claims import paper_comparison
from repdiag.binding.analysis.columns import l_iso_columns
from repdiag.binding.dose import dose_correlations
from repdiag.binding.stats_options import JER_FORMULAS, JER_SUMMARIES, READOUTS, StatsSettings
from repdiag.common import statistics as stats
from repdiag.common.intervals import mean_interval


def headline_metrics(table: pd.DataFrame, settings: StatsSettings) -> list[str]:
    """Columns correlated with binding in correlations.csv, in reading order."""
    columns = [
        "g_pr",
        "g_iso",
        *l_iso_columns(table),
        "effective_rank",
        "participation_ratio",
    ]
    columns += ["jer", "same_different", *settings.covariates]
    return [c for c in columns if c in table.columns]


def robustness_variants(table: pd.DataFrame) -> list[dict[str, str]]:
    """Every L.Iso k, geometry rank formulation and JER formulation/summary in the table."""
    variants = [
        {"group": "l_iso", "variant": f"k={c[7:]}", "metric": c} for c in l_iso_columns(table)
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
OBJECTIVES = "objectives (seed means)"
UNITS = {
    TRAINED: "model (seeds of an objective counted apart)",
    LEARNED: "model (seeds of an objective counted apart)",
    WITH_CONTROLS: "model (seeds of an objective counted apart)",
    OBJECTIVES: "objective (mean over its seeds)",
}


def objective_means(table: pd.DataFrame) -> pd.DataFrame:
    """One row per objective, the unit of the family comparison: every numeric column averaged
    over the objective's seeds (``n_seeds`` of them). A zoo model's objective is its run's
    (``objective``); any other model is its own unit. Seeds are nested in their objective, so
    two seeds of one objective are not two observations of how objectives differ."""
    if table.empty:
        return table.assign(n_seeds=[])
    objective = table.get("objective", pd.Series(np.nan, index=table.index))
    units = [
        str(o) if isinstance(o, str) and o != "nan" else str(m)
        for o, m in zip(objective, table["model"], strict=True)
    ]
    numeric = table.select_dtypes("number").assign(unit=units)
    means = numeric.groupby("unit", sort=True).mean()
    means["n_seeds"] = numeric.groupby("unit", sort=True).size()
    families = table.assign(unit=units).groupby("unit", sort=True)["family"].first()
    return means.assign(family=families).rename_axis("model").reset_index()


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


def family_table(
    table: pd.DataFrame,
    metrics: Sequence[str],
    *,
    confidence: float = 0.95,
    family_column: str = "family",
) -> pd.DataFrame:
    """Per family and metric: number of models, mean, SD and t-interval of the mean."""
    stats.require_columns(table, [family_column, "model", *metrics], "the models table")
    rows = []
    for family, group in table.groupby(family_column, sort=True):
        for metric in metrics:
            values = group[metric].to_numpy(float)
            n = int(np.isfinite(values).sum())
            mean, sd, low, high = mean_interval(values, confidence)
            note = "" if n >= 2 else f"{n} model(s) in this family: no interval"
            rows.append(
                {
                    "family": family,
                    "metric": metric,
                    "n": n,
                    "mean": mean,
                    "sd": sd,
                    "ci_low": low,
                    "ci_high": high,
                    "confidence": confidence,
                    "models": ";".join(group["model"].astype(str)),
                    "note": note,
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "family",
            "metric",
            "n",
            "mean",
            "sd",
            "ci_low",
            "ci_high",
            "confidence",
            "models",
            "note",
        ],
    )


def robustness_table(
    table: pd.DataFrame,
    variants: Sequence[Mapping[str, str]],
    targets: Sequence[str],
    **options: Any,
) -> pd.DataFrame:
    """Correlations of every metric variant with every target.

    ``variants`` are mappings with ``group`` (e.g. ``l_iso``), ``variant`` (e.g. ``k=10``) and
    ``metric`` (the column). Variants or targets absent from ``table`` are skipped.
    """
    frames = []
    for target in targets:
        if target not in table.columns:
            continue
        present = [v for v in variants if v["metric"] in table.columns]
        if not present:
            continue
        frame = stats.correlation_table(table, target, [v["metric"] for v in present], **options)
        frame.insert(0, "variant", [v["variant"] for v in present])
        frame.insert(0, "group", [v["group"] for v in present])
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["group", "variant", "metric", "target", "n", "note"])
    return pd.concat(frames, ignore_index=True)


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
    means = objective_means(table)
    if len(means) < n:  # some objective has several seeds: the rows with the objective as unit
        per_objective = stats.correlation_table(
            means, "binding", headline_metrics(means, settings), **options
        )
        per_objective.insert(0, "models", OBJECTIVES)
        correlations = pd.concat([correlations, per_objective], ignore_index=True)
    correlations.insert(1, "unit", correlations["models"].map(UNITS))
    fits = ols_fits(table, settings)
    control_sets = [["same_different"]] + [[c] for c in settings.covariates]
    if len(settings.covariates) > 1:
        control_sets.append(list(settings.covariates))
    partial = stats.partial_table(table, "jer", "binding", control_sets, **options)
    families = family_table(
        everything,
        [m for m in FAMILY_METRICS if m in everything.columns],
        confidence=settings.confidence,
    )
    robustness = robustness_table(
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

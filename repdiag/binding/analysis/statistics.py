"""Every table of the binding analysis across models (``statistics_tables``): correlations with
binding, OLS fits, partial correlations, family means, robustness over metric variants, the dose
series and the paper comparison, computed with :mod:`repdiag.common.statistics`.

The unit is the objective with its seeds nested (:mod:`repdiag.binding.analysis.units`): the
training runs of an objective (its configuration) are averaged into one row before any
correlation, fit, partial correlation or robustness row is computed, so n counts objectives and
every table states its ``unit``, its ``n`` and the training runs behind it (``n_runs``); an
analysis handed two rows of one unit is refused, naming them. Correlations, fits, partial
correlations and robustness are over the objectives of the families (not the controls,
binding-supervised upper bounds, dose-series runs or JER interventions: ``APART_FAMILIES``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding import APART_FAMILIES
from repdiag.binding.analysis.claims import paper_comparison
from repdiag.binding.analysis.columns import l_iso_columns
from repdiag.binding.analysis.options import JER_FORMULAS, JER_SUMMARIES, READOUTS, StatsSettings
from repdiag.binding.analysis.units import (
    COMPARED_APART,
    LEARNED,
    TRAINED,
    UNIT,
    UNIT_WITH_CONTROLS,
    WITH_CONTROLS,
    comparison_units,
    require_units,
    runs_behind,
    saved_steps,
    unit_means,
    with_units,
)
from repdiag.binding.dose import dose_correlations
from repdiag.binding.metrics.readouts import WIN_RATE_CHANCE
from repdiag.common import statistics as stats
from repdiag.common.claims import study_claims
from repdiag.common.exact import exact_p
from repdiag.common.intervals import mean_interval
from repdiag.common.mixed import BetweenWithin, between_within
from repdiag.common.ols import OLSFit, fit_ols, ols_summary_text, ols_table
from repdiag.common.power import correlation_power, detectable_correlation
from repdiag.common.replication import t_interval
from repdiag.common.units import Units
from repdiag.core.errors import StoreError


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


def robustness_targets() -> list[str]:
    """Both binding scores of every readout: accuracy (``binding_<readout>``) and the win rate
    (``binding_<readout>_win``), whichever the headline uses."""
    return [f"binding_{r}{score}" for score in ("", "_win") for r in READOUTS]


FAMILY_METRICS = (
    "binding_cosine",
    "binding_knn",
    "binding_local_pca",
    "binding_cosine_win",
    "binding_knn_win",
    "binding_local_pca_win",
    "same_different",
    "jer",
    "g_pr",
    "g_iso",
    "effective_rank",
)


def ols_fits(table: pd.DataFrame, settings: StatsSettings) -> list[OLSFit]:
    """The paper's bivariate fit, its univariate parts, geometry fits, JER beside G.PR (the
    paper's question as a contrast: JER's coefficient with global geometry in the model, and
    G.PR's with JER), and one with covariates, over units (one row per objective, seeds
    averaged; refused otherwise)."""
    require_units(table, "the OLS fits")
    predictor_sets = [
        ["jer", "same_different"], ["jer"], ["same_different"], ["g_iso"], ["jer", "g_pr"],
    ]  # fmt: skip
    if settings.covariates:
        predictor_sets.append(["jer", "same_different", *settings.covariates])
    kwargs = {"confidence": settings.confidence, "min_models": settings.min_models}
    return [fit_ols(table, "binding", p, **kwargs) for p in predictor_sets]


def ols_frame(fits: list[OLSFit], means: pd.DataFrame) -> pd.DataFrame:
    """``ols.csv``: :func:`repdiag.common.ols.ols_table` with the unit and the training
    runs behind each fit's n."""
    frame = ols_table(fits)
    runs = {fit.formula: runs_behind(means, [fit.response, *fit.predictors]) for fit in fits}
    frame.insert(2, "unit", UNIT)
    frame.insert(4, "n_runs", frame["formula"].map(runs))
    return frame


def learned_models(table: pd.DataFrame) -> pd.DataFrame:
    """The models whose zoo run passed its learning check, plus every model not trained by the
    workflow (``learned`` NaN: pretrained weights, nothing to check)."""
    if "learned" not in table:
        return table
    flags = table["learned"].to_numpy(float)
    return table[~(flags == 0.0)].reset_index(drop=True)


def trained_models(table: pd.DataFrame) -> pd.DataFrame:
    """The final networks of an objective family (not controls, not told the binding): the
    population of every correlation and fit. A step a run saved on its way (``step`` below the
    configured ``steps``) is a point inside its run, not a network of its own, and is left out."""
    return table[~table["family"].isin(APART_FAMILIES) & ~saved_steps(table)].reset_index(drop=True)


FAMILY_COLUMNS = [
    "family",
    "metric",
    "unit",
    "n",
    "n_runs",
    "mean",
    "sd",
    "ci_low",
    "ci_high",
    "null",
    "p",
    "p_exact",
    "confidence",
    "models",
    "note",
]


def null_value(group: pd.DataFrame, metric: str) -> float:
    """The value a family's mean is tested against: chance for a binding score (the models
    table's ``chance`` for accuracy, 1/2 for a win rate ``binding_*_win``, ``binding_chance``
    for the headline column ``binding``), 0.5 for Same/Different, 0 for every other metric."""
    if metric.endswith("_win") and metric.startswith("binding"):
        return WIN_RATE_CHANCE
    column = "binding_chance" if metric == "binding" and "binding_chance" in group else "chance"
    if metric.startswith("binding"):
        return float(group[column].mean()) if column in group else math.nan
    return 0.5 if metric == "same_different" else 0.0


def family_row(group: pd.DataFrame, metric: str, confidence: float) -> dict[str, object]:
    """One family and metric: the mean over the family's units (objectives, seeds averaged), its
    SD, Student-t interval mean +- t_{n-1} SD / sqrt(n) and two-sided one-sample t p against
    :func:`null_value`, and beside it the exact sign-flip p of the differences from the null
    (``p_exact``, :func:`repdiag.common.exact.exact_p`: n <= 10). A family of one unit
    trained with several seeds takes its interval over those training runs instead (the row's
    ``unit`` says so); one run: no interval."""
    means = unit_means(group, f"the family mean of {metric}")
    values, runs = means[metric].to_numpy(float), runs_behind(means, [metric])
    unit = "model" if (means["n_runs"] == 1).all() else UNIT
    if len(means) == 1 and runs > 1:
        values = group[metric].to_numpy(float)
        unit = f"training run (seed) of {means['unit'].iloc[0]}"
    n = int(np.isfinite(values).sum())
    mean, sd, low, high = mean_interval(values, confidence)
    null = null_value(group, metric)
    p = t_interval(values - null, confidence)[4] if np.isfinite(null) else math.nan
    p_exact = exact_p(values - null) if np.isfinite(null) else math.nan
    return {
        "unit": unit,
        "n": n,
        "n_runs": runs,
        "mean": mean,
        "sd": sd,
        "ci_low": low,
        "ci_high": high,
        "null": null,
        "p": p,
        "p_exact": p_exact,
        "confidence": confidence,
        "note": "" if n >= 2 else f"{n} unit(s) in this family: no interval",
    }


def family_table(
    table: pd.DataFrame,
    metrics: Sequence[str],
    *,
    confidence: float,
    family_column: str = "family",
) -> pd.DataFrame:
    """Per family and metric (``families.csv``): :func:`family_row` over the family's units,
    with the number of units (``n``), the training runs behind them and the runs' names."""
    stats.require_columns(table, [family_column, "model", *metrics], "the models table")
    table = table if "training_run" in table else with_units(table)
    rows = [
        {
            "family": family,
            "metric": metric,
            **family_row(group, metric, confidence),
            "models": ";".join(group["model"].astype(str)),
        }
        for family, group in table.groupby(family_column, sort=True)
        for metric in metrics
    ]
    return pd.DataFrame(rows, columns=FAMILY_COLUMNS)


def robustness_table(
    table: pd.DataFrame,
    variants: Sequence[Mapping[str, str]],
    targets: Sequence[str],
    **options: Any,
) -> pd.DataFrame:
    """Correlations of every metric variant with every target.

    ``variants`` are mappings with ``group`` (e.g. ``l_iso``), ``variant`` (e.g. ``k=10``) and
    ``metric`` (the column). Variants or targets absent from ``table`` are skipped. The rows of
    ``table`` are units (refused otherwise).
    """
    require_units(table, "the robustness correlations")
    frames = []
    for target in targets:
        if target not in table.columns:
            continue
        present = [v for v in variants if v["metric"] in table.columns]
        if not present:
            continue
        metrics = [v["metric"] for v in present]
        units = comparison_units(table)
        frame = stats.correlation_table(table, target, metrics, units=units, **options)
        frame.insert(0, "variant", [v["variant"] for v in present])
        frame.insert(0, "group", [v["group"] for v in present])
        frame.insert(4, "unit", UNIT)
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["group", "variant", "metric", "target", "n", "note"])
    return pd.concat(frames, ignore_index=True)


def correlation_rows(
    means: pd.DataFrame, models: str, settings: StatsSettings, unit: str = UNIT
) -> pd.DataFrame:
    """Every headline metric's correlation with binding over ``means`` (one row per unit,
    refused otherwise), labelled ``models``, with its unit, the training runs behind each n, the
    power of its test at the paper's r (``power_at_paper_r``) and the smallest |r| its n
    detects with 80% power (``r_detectable_80``)."""
    require_units(means, f"the correlations over {models}")
    metrics = headline_metrics(means, settings)
    units = comparison_units(means)
    frame = stats.correlation_table(means, "binding", metrics, units=units, **settings.options())
    frame.insert(0, "models", models)
    frame.insert(1, "unit", unit)
    frame.insert(5, "n_runs", [runs_behind(means, [m, "binding"]) for m in metrics])
    # what the n could detect (repdiag.common.power, two-sided at 1 - confidence)
    paper_r = study_claims("binding")["jer_binding_r"].value
    alpha = 1 - settings.confidence
    frame["power_at_paper_r"] = [correlation_power(paper_r, int(n), alpha) for n in frame["n"]]
    frame["r_detectable_80"] = [detectable_correlation(int(n), 0.8, alpha) for n in frame["n"]]
    return frame


def between_within_table(runs: pd.DataFrame, settings: StatsSettings) -> pd.DataFrame:
    """``between_within.csv``: per headline metric, its slope on binding split into the slope
    across objectives (their seed means) and within them (across seeds), with the random-intercept
    fit beside them (:func:`repdiag.common.mixed.between_within`); the training runs are the
    rows, each objective a group."""
    metrics = headline_metrics(runs, settings)
    units = Units(
        tuple(map(str, runs["training_run"])), tuple(map(str, runs["unit"])), "training run",
        tuple(map(str, runs["model"])),
    )  # fmt: skip
    y = runs["binding"].to_numpy(float)
    rows = []
    for metric in metrics:
        split = between_within(
            runs[metric].to_numpy(float), y, units, confidence=settings.confidence
        )
        rows.append({"metric": metric, "target": "binding", "group": "objective", **asdict(split)})
    frame = pd.DataFrame(
        rows, columns=["metric", "target", "group", *BetweenWithin.__dataclass_fields__]
    )
    frame["confidence"] = settings.confidence
    return frame


def comparison_models(everything: pd.DataFrame) -> pd.DataFrame:
    """The networks of the family comparison: the objective families' runs, the controls and
    the binding-supervised upper bounds (the dose series and the JER intervention are analysed
    apart: repdiag.binding.dose, repdiag.binding.causal); final networks only (:func:`saved_steps`)."""
    apart = [f for f in APART_FAMILIES if f not in COMPARED_APART]
    keep = ~everything["family"].isin(apart) & ~saved_steps(everything)
    return everything[keep].reset_index(drop=True)


def family_means(table: pd.DataFrame) -> pd.DataFrame:
    """The units of the family comparison, one row each: the objective families' final networks
    (:func:`trained_models`), seeds averaged (:func:`repdiag.binding.analysis.units.unit_means`)."""
    return unit_means(trained_models(with_units(table)), "the family comparison")


def statistics_tables(
    table: pd.DataFrame, depth: pd.DataFrame, settings: StatsSettings
) -> dict[str, pd.DataFrame | str]:
    """Every table of the analysis, keyed by output name (``correlations``, ``ols``, ...).

    Correlations, fits, partial correlations, robustness and the paper comparison are over the
    objectives of the families, seeds averaged (:func:`repdiag.binding.analysis.units.unit_means`);
    ``correlations`` repeats every metric over the objectives whose runs learned and over the
    objectives with the controls and upper bounds (``models`` column), and ``families`` lists
    the controls and upper bounds as families of their own. The paper comparison reads accuracy
    whatever the headline score (:func:`in_accuracy`)."""
    options = settings.options()
    everything = with_units(table)
    runs = trained_models(everything)
    means = unit_means(runs, "the family comparison")
    n = len(means)
    frames = [correlation_rows(means, TRAINED, settings)]
    learned = learned_models(runs)
    if 0 < len(learned) < len(runs):
        frames.append(correlation_rows(unit_means(learned, LEARNED), LEARNED, settings))
    compared = comparison_models(everything)
    if len(compared) > len(runs):
        with_controls = unit_means(compared, "the comparison with the controls")
        frames.append(correlation_rows(with_controls, WITH_CONTROLS, settings, UNIT_WITH_CONTROLS))
    fits = ols_fits(means, settings)
    families = family_table(
        compared,
        [m for m in FAMILY_METRICS if m in compared.columns],
        confidence=settings.confidence,
    )
    robustness = robustness_table(
        means, robustness_variants(means), robustness_targets(), **options
    )
    tables: dict[str, pd.DataFrame | str] = {
        "correlations": pd.concat(frames, ignore_index=True),
        "ols": ols_frame(fits, means),
        "ols_summary": unit_line(means) + ols_summary_text(fits),
        "partial": partial_table(means, settings),
        "families": families,
        "robustness": robustness,
        "dose_series": dose_correlations(everything, options),
        "between_within": between_within_table(runs, settings),
    }
    tables["paper_comparison"] = paper_comparison(
        *in_accuracy(means, tables, settings), depth=depth, runs=runs
    )
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


def partial_table(means: pd.DataFrame, settings: StatsSettings) -> pd.DataFrame:
    """Partial r of JER with binding given Same/Different, each covariate, and all covariates."""
    control_sets = [["same_different"]] + [[c] for c in settings.covariates]
    if len(settings.covariates) > 1:
        control_sets.append(list(settings.covariates))
    require_units(means, "the partial correlations")
    partial = stats.partial_table(means, "jer", "binding", control_sets, **settings.options())
    partial.insert(3, "unit", UNIT)
    return partial


def in_accuracy(
    means: pd.DataFrame, tables: Mapping[str, Any], settings: StatsSettings
) -> tuple[pd.DataFrame, dict[str, Any], StatsSettings]:
    """The paper's claims are about binding accuracy: where the headline score is the win rate
    (``stats.binding_score``), the paper comparison reads its correlations, fits and partial
    correlations computed again on accuracy (``binding_<readout>``), so that the paper's r = 0.69
    or 44% stands beside the run's accuracy, never beside a win rate."""
    if settings.binding_score == "accuracy":
        return means, dict(tables), settings
    accuracy = replace(settings, binding_score="accuracy")
    if accuracy.binding_column not in means:
        raise StoreError(
            f"the models table has no {accuracy.binding_column} (accuracy) column, which the paper "
            "comparison reads: rerun aggregate_models"
        )
    scored = means.assign(binding=means[accuracy.binding_column])
    return (
        scored,
        {
            **tables,
            "correlations": correlation_rows(scored, TRAINED, accuracy),
            "ols": ols_frame(ols_fits(scored, accuracy), scored),
            "partial": partial_table(scored, accuracy),
        },
        accuracy,
    )


def unit_line(means: pd.DataFrame) -> str:
    """The first line of ``ols_summary.txt``: what a row of the fits is, and how many."""
    runs = int(means["n_runs"].sum()) if "n_runs" in means else len(means)
    return f"Unit: {UNIT}; n = {len(means)} units from {runs} training runs.\n\n"

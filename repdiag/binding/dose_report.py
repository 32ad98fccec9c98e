"""The dose series' section of the binding summary (``summary.md``): the final network of every
run with its binding interval, the pre-registered analysis of :mod:`repdiag.binding.dose` (unit
and n stated, the parametric p beside every interval, the exact and permutation p beside the t
p) and the trajectories of runs with checkpoints."""

from __future__ import annotations

import numpy as np
import pandas as pd

from repdiag.binding.dose import UNIT, dose_series, final_runs, series_metrics, trajectories
from repdiag.common.exact import format_p, format_permutation_p
from repdiag.common.replication import describe
from repdiag.common.tables import format_number, markdown_table


def _interval(row: pd.Series, column: str) -> str:
    low, high = row.get(f"{column}_ci_low", np.nan), row.get(f"{column}_ci_high", np.nan)
    value = format_number(row[column])
    if not (np.isfinite(low) and np.isfinite(high)):
        return value
    return f"{value} [{format_number(low, '.2f')}, {format_number(high, '.2f')}]"


def _with_p(row: pd.Series, estimate: str, low: str, high: str, p: str) -> str:
    """``estimate [low, high], p = P``: every interval with its parametric p beside it."""
    return describe(*(float(row.get(c, np.nan)) for c in (estimate, low, high, p)))


def _permutation_p(row: pd.Series) -> str:
    """The seed-blocked permutation p; a Monte Carlo one at its floor 1/(1 + B) as ``< 1/B``."""
    exact = str(row.get("permutation_exact", "")).lower() == "true"  # a bool; NaN: no test
    draws = None if exact else int(row.get("n_permutations", 0) or 0) or None
    return format_p(float(row["permutation_p_greater"]), draws)


def _pearson_exact(row: pd.Series) -> str:
    """``; permutation p = P`` beside Pearson's t p (up to 10 runs: ``pearson_p_exact``, a
    Monte Carlo one at its floor as ``< 1/B``); nothing where it was not computed."""
    p = float(row.get("pearson_p_exact", np.nan))
    if not np.isfinite(p):
        return ""
    return f"; permutation p = {format_permutation_p(p, int(row['n']))}"


def _df(row: pd.Series) -> str:
    df = row.get("fe_df", np.nan)
    return f" (df {int(df)})" if np.isfinite(float(df)) and float(df) > 0 else ""


def _runs_table(finals: pd.DataFrame, binding_column: str, confidence: float) -> str:
    l_iso = [c for c in series_metrics(finals) if c.startswith("l_iso")][:1]
    rows = [
        {
            "model": row["model"],
            "lambda": format_number(row["dose"], "g"),
            "seed": format_number(row.get("seed", np.nan), ".0f"),
            "step": format_number(row.get("step", np.nan), ".0f"),
            f"binding ({confidence:.0%} CI)": _interval(row, binding_column),
            "JER": format_number(row["jer"], ".2f"),
            "pr (full)": format_number(row.get("pr_full", np.nan), ".1f"),
            "G.PR": format_number(row.get("g_pr", np.nan)),
            "G.Iso": format_number(row.get("g_iso", np.nan), ".2f"),
            **{f"L.Iso k={c[7:]}": format_number(row[c], ".2f") for c in l_iso},
        }
        for _, row in finals.iterrows()
    ]
    return markdown_table(pd.DataFrame(rows))


def _analysis_tables(analysis: pd.DataFrame, confidence: float) -> list[str]:
    slopes = analysis[analysis["analysis"] == "slope on binding"]
    pairs = analysis[analysis["analysis"] == "|std slope| difference"]
    n, seeds = int(analysis["n"].iloc[0]), int(slopes["n_seeds"].max()) if len(slopes) else 0
    ci = f"{confidence:.0%} CI"
    slope_rows = [
        {
            "metric": row["metric"],
            f"slope per seed, mean ({ci}), t p": _with_p(row, "estimate", "ci_low", "ci_high", "p"),
            "sign-flip p (exact)": format_p(row.get("p_exact", np.nan)),
            "standardised": _with_p(row, "std_estimate", "std_ci_low", "std_ci_high", "p"),
            "Pearson r (bootstrap over runs), p": _with_p(
                row, "pearson_r", "pearson_ci_low", "pearson_ci_high", "pearson_p"
            )
            + _pearson_exact(row),
            "seed-blocked permutation p (r > 0)": _permutation_p(row),
            "seed fixed effects slope, t p (df)": _with_p(
                row, "fe_slope", "fe_ci_low", "fe_ci_high", "fe_p"
            )
            + _df(row),
        }
        for _, row in slopes.iterrows()
    ]
    lines = [
        f"Each metric against binding (unit: {UNIT}; n = {n} runs, {seeds} seeds as blocks; "
        "slopes per seed, t-interval over seeds):",
        "",
        markdown_table(pd.DataFrame(slope_rows)),
        "",
    ]
    if len(pairs):
        pair_rows = [
            {
                "|std slope| of": row["metric"],
                f"difference per seed, mean ({ci}), t p": _with_p(
                    row, "estimate", "ci_low", "ci_high", "p"
                ),
                "sign-flip p (exact)": format_p(row.get("p_exact", np.nan)),
                "n seeds": int(row["n_seeds"]),
            }
            for _, row in pairs.iterrows()
        ]
        lines += [
            "Does JER track binding more than global geometry does? Per seed, the absolute "
            "standardised slope of the Jacobian metric minus the geometry metric's (positive: "
            "JER moves more per SD of binding):",
            "",
            markdown_table(pd.DataFrame(pair_rows)),
            "",
        ]
    return lines


def _trajectory_lines(models: pd.DataFrame) -> list[str]:
    paths = trajectories(models)
    if paths.empty:
        return []
    rows = [
        {
            "run": row["run"],
            "step": format_number(row["step"], ".0f"),
            "model": row["model"],
            "binding": format_number(row["binding"]),
            "JER": format_number(row["jer"], ".2f"),
            "G.PR": format_number(row.get("g_pr", np.nan)),
            "G.Iso": format_number(row.get("g_iso", np.nan), ".2f"),
        }
        for _, row in paths.iterrows()
    ]
    return [
        "Trajectories (checkpoints of one run are not independent units: shown, not tested; "
        "step 0 is the untrained control of the same seed, listed once):",
        "",
        markdown_table(pd.DataFrame(rows)),
        "",
    ]


def dose_markdown(
    models: pd.DataFrame, correlations: pd.DataFrame, binding_column: str, confidence: float
) -> list[str]:
    """The summary's dose-series section: what was manipulated, the final network of every run
    with its binding interval, the pre-registered analysis (unit and n stated, the parametric p
    beside every interval) and the trajectories of runs with checkpoints."""
    finals = final_runs(dose_series(models))
    lines = ["## Binding dose series (binding manipulated; apart from the families)", ""]
    if finals.empty:
        return [*lines, "No dose series in this config (two or more doses of series.dose).", ""]
    lines += [
        f"{len(finals)} training runs at {finals['dose'].nunique()} doses and "
        f"{finals['seed'].nunique()} seeds (unit: {UNIT}): a presence-supervised backbone told "
        "the slot labels through a second head weighted by lambda (L = L_presence + lambda * "
        "L_slots; lambda = 0 is the presence run). Binding spans "
        f"{format_number(finals['binding'].min())} to {format_number(finals['binding'].max())}.",
        "",
        _runs_table(finals, binding_column, confidence),
        "",
    ]
    if len(correlations) and "analysis" in correlations and correlations["n"].iloc[0] > 0:
        lines += _analysis_tables(correlations, confidence)
    return [*lines, *_trajectory_lines(models)]

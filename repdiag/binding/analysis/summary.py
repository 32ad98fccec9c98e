"""``results/summary.md``: the headline numbers of a run as markdown, generated from the tables,
and the zoo's loss curves as one table."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding import APART_FAMILIES
from repdiag.binding.analysis.columns import l_iso_columns, metric_label
from repdiag.binding.analysis.design_summary import (
    primary_section,
    units_section,
    within_run_section,
)
from repdiag.binding.analysis.options import READOUTS, StatsSettings
from repdiag.binding.analysis.statistics import trained_models
from repdiag.binding.analysis.units import LEARNED, TRAINED, WITH_CONTROLS, unit_labels
from repdiag.binding.dose_report import dose_markdown
from repdiag.common import statistics as stats
from repdiag.common.exact import format_permutation_p
from repdiag.common.tables import format_number as _fmt
from repdiag.common.tables import markdown_table


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


def with_interval(row: pd.Series, column: str) -> str:
    """``value [low, high]`` from a row's ``column`` and ``column_ci_low/_high``; ``n/a`` when
    the value is missing, the value alone when its interval is."""
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
    l_iso = l_iso_columns(table)
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
                    f"binding {readout}": with_interval(row, f"binding_{readout}")
                    for readout in READOUTS
                },
                **{
                    f"win rate {readout}": with_interval(row, f"binding_{readout}_win")
                    for readout in READOUTS
                },
                "Same/Different": with_interval(row, "same_different"),
                "JER final": _fmt(row.get("jer", math.nan), ".1f"),
                "JER by tap": " → ".join(_fmt(v, ".1f") for v in layers["jer_mean"]) or "n/a",
                "G.PR": _fmt(row.get("g_pr", math.nan)),
                "G.Iso": _fmt(row.get("g_iso", math.nan), ".2f"),
                **({metric_label(l_iso[0]): _fmt(row[l_iso[0]], ".2f")} if l_iso else {}),
            }
        )
    return pd.DataFrame(rows)


MODEL_COLUMNS = (
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
SUMMARY_TABLES = (
    "correlations", "ols", "paper_comparison", "dose_series", "depth_profiles", "primary",
    "within_run",
)  # fmt: skip
"""The tables a summary reads beside ``models``: the last two are the family comparison's own."""
TABLE_NAMES = (
    "models, correlations, ols, ols_summary.txt, partial, families, robustness, dose_series, "
    "paper_comparison, depth_profiles, spectra"
)


def files_section(tables_dir: str = "results/tables") -> list[str]:
    """Where the digest's tables and figures are: the main study's in results/tables and
    results/figures; another target's (binding_families) in its own folder, scatter included."""
    if tables_dir.rstrip("/") == "results/tables":
        where = (
            f"Tables in `results/tables/` ({TABLE_NAMES}); figures in `results/figures/` "
            "(metric_scatter, jacobian_spectra, depth_profiles, readouts)"
        )
    else:
        where = f"Tables in `{tables_dir}/` ({TABLE_NAMES}) and the figure metric_scatter there"
    report = "the HTML report is built with `snakemake --report results/report.html`."
    return ["## Files", "", f"{where}; {report}", ""]


def summary_markdown(
    table: pd.DataFrame,
    tables: Mapping[str, Any],
    settings: StatsSettings,
    zoo: pd.DataFrame | None = None,
    tables_dir: str = "results/tables",
) -> str:
    """``results/summary.md``: the headline numbers of this run, generated from the tables
    (read from ``tables_dir``, which its Files section names)."""
    everything, table = table, trained_models(table)
    controls = everything[everything["family"].isin(APART_FAMILIES)]
    lines = header_lines(table, len(controls), settings)
    lines += headline_lines(table, tables, settings)
    if "primary" in tables:
        lines += ["", *primary_section(tables["primary"], settings.confidence)]
        lines += units_section(everything, settings)
        lines.pop()
    if "within_run" in tables:
        lines += ["", *within_run_section(tables["within_run"])]
        lines.pop()
    if "dose_series" in tables:
        lines += [""]
        lines += dose_markdown(
            everything, tables["dose_series"], settings.binding_column, settings.confidence
        )
        lines.pop()
    lines += ["", "## Paper comparison", ""]
    comparison = tables["paper_comparison"][["claim", "paper_text", "run_text", "n_models"]]
    lines += [markdown_table(comparison), ""]
    lines += model_sections(everything, table, controls, tables, settings)
    if zoo is not None and len(zoo):
        lines += zoo_section(zoo)
    return "\n".join(lines + files_section(tables_dir))


def header_lines(table: pd.DataFrame, n_controls: int, settings: StatsSettings) -> list[str]:
    """What was analysed and how, a note when there are too few models, the learning check."""
    n = len(table)
    units = len(set(table["unit"] if "unit" in table else unit_labels(table)))
    lines = [
        "# repdiag binding study: summary",
        "",
        f"{n} trained models in {table['family'].nunique()} families and {n_controls} controls, "
        "binding-supervised upper bounds or dose-series runs (kept out of every correlation and "
        "fit across families). Unit of the family comparison: the objective, its seeds nested "
        f"(its training runs averaged): n = {units} units. Binding "
        f"readout `{settings.readout}`, "
        f"JER formula `{settings.jer_formula}` at the `{settings.jer_at}` layer on the "
        f"`{settings.probe_set}` probe images; {settings.n_bootstrap} bootstrap resamples of units, "
        f"seed {settings.seed}, {settings.confidence:.0%} intervals with the parametric p beside.",
        "",
    ]
    if units < settings.min_models:
        lines += [
            f"**Note:** {stats.too_few_note(units, settings.min_models, 'the statistics')}.",
            "",
        ]
    if "learned" in table and table["learned"].notna().any():
        checked = table[table["learned"].notna()]
        failed = checked.loc[checked["learned"] == 0, "model"].tolist()
        lines += [
            f"Learning check (zoo runs, repdiag.encoders.zoo.learning): "
            f"{len(checked) - len(failed)} of {len(checked)} trained runs learned"
            + (f"; not learned: {', '.join(failed)}." if failed else "."),
            "",
        ]
    return lines


def _pearson_p(row: pd.Series) -> str:
    """``p = P`` (Pearson's t p) and beside it, up to 10 units, ``(permutation p = P)``
    (``pearson_p_exact``; a Monte Carlo one at its floor as ``< 1/B``)."""
    text = f"p = {_fmt(row['pearson_p'], '.3g')}"
    exact = float(row.get("pearson_p_exact", np.nan))
    if not np.isfinite(exact):
        return text
    shown = format_permutation_p(exact, int(row["n"]), row.get("n_permutations"))
    return f"{text} (permutation p = {shown})"


def _ols_line(fit: pd.DataFrame, label: str) -> str:
    """One bullet of an OLS fit over units: its n, R^2 and every non-intercept coefficient with
    its interval and p."""
    head = fit.iloc[0]
    terms = [
        f"{row['term']} {_fmt(row['coef'], '.3g')} [{_fmt(row['ci_low'], '.3g')}, "
        f"{_fmt(row['ci_high'], '.3g')}], p = {_fmt(row['p'], '.3g')}"
        for _, row in fit.iterrows()
        if row["term"] != "Intercept"
    ]
    return (
        f"- OLS binding ~ {label} (unit: {head.get('unit', 'model')}, n = {int(head['n'])}): "
        f"R^2 = {_fmt(head['r2'])}, adjusted R^2 = {_fmt(head['adj_r2'])}"
        + (f"; {'; '.join(terms)}" if terms else "")
        + f". {head['note'] or ''}".rstrip()
    )


def _ci_text(row: pd.Series, confidence: float) -> str:
    """``r = R, 95% CI [low, high], p = P`` of a correlation row."""
    low, high = _fmt(row["pearson_ci_low"]), _fmt(row["pearson_ci_high"])
    return f"r = {_fmt(row['pearson_r'])}, {confidence:.0%} CI [{low}, {high}], {_pearson_p(row)}"


def _r_text(row: pd.Series) -> str:
    """``r = R [low, high], p = P`` of a correlation row (its permutation p beside, small n)."""
    low, high = _fmt(row["pearson_ci_low"]), _fmt(row["pearson_ci_high"])
    return f"r = {_fmt(row['pearson_r'])} [{low}, {high}], {_pearson_p(row)}"


def headline_lines(
    table: pd.DataFrame, tables: Mapping[str, Any], settings: StatsSettings
) -> list[str]:
    """JER vs binding over the families' units (objectives, seeds averaged), then over the
    objectives whose runs learned and with the controls, the paper's bivariate fit and the
    geometry correlations, one bullet each: n, the interval and its parametric p."""
    all_corr = tables["correlations"]
    models_column = all_corr.get("models", pd.Series(TRAINED, index=all_corr.index))
    corr = all_corr[models_column == TRAINED]
    lines = []
    jer = corr[corr["metric"] == "jer"]
    if len(jer):
        row = jer.iloc[0]
        lines.append(
            f"- JER vs binding (unit: {row.get('unit', 'model')}, n = {int(row['n'])}): "
            f"Pearson {_ci_text(row, settings.confidence)}; Spearman rho = {_fmt(row['spearman_rho'])} "
            f"[{_fmt(row['spearman_ci_low'])}, {_fmt(row['spearman_ci_high'])}], "
            f"p = {_fmt(row['spearman_p'], '.3g')}. {row['note'] or ''}".rstrip()
        )
    for models, label in (
        (LEARNED, "the objectives whose runs learned"),
        (WITH_CONTROLS, "objectives, controls and upper bounds (a zero Jacobian has no JER)"),
    ):
        other = all_corr[(models_column == models) & (all_corr["metric"] == "jer")]
        if len(other):
            row = other.iloc[0]
            lines.append(
                f"- The same over {label} (n = {int(row['n'])}): "
                f"{_ci_text(row, settings.confidence)}."
            )
    ols = tables["ols"]
    for formula, label in (
        ("binding ~ jer + same_different", "JER + Same/Different"),
        ("binding ~ jer + g_pr", "JER + G.PR (JER beyond global geometry, and the reverse)"),
    ):
        fit = ols[ols["formula"] == formula]
        if len(fit):
            lines.append(_ols_line(fit, label))
    geometry = corr[corr["metric"].isin(["g_pr", "g_iso", *l_iso_columns(table)])]
    if len(geometry):
        parts = [f"{metric_label(row['metric'])} {_r_text(row)}" for _, row in geometry.iterrows()]
        lines.append("- Geometry vs binding (same units): " + "; ".join(parts) + ".")
    lines += other_score_lines(tables.get("robustness"), settings)
    if len(jer) and "power_at_paper_r" in jer:
        lines.append(power_line(jer.iloc[0]))
    return lines


def other_score_lines(robustness: pd.DataFrame | None, settings: StatsSettings) -> list[str]:
    """The headline correlations with the other binding score (the win rate beside accuracy,
    accuracy beside the win rate): JER, G.PR and G.Iso over the same units."""
    win = settings.binding_score != "win_rate"
    target = f"binding_{settings.readout}{'_win' if win else ''}"
    if robustness is None or "target" not in robustness:
        return []
    rows = robustness[robustness["target"] == target].set_index("metric")
    parts = [
        f"{label} {_r_text(rows.loc[m])}"
        for m, label in ((settings.jer_column, "JER"), ("g_pr", "G.PR"), ("g_iso", "G.Iso"))
        if m in rows.index
    ]
    if not parts:
        return []
    score = (
        "the win rate (the share of wrong candidates scored below the correct one: 0.5 at "
        "chance, 1 for the shape oracle)"
        if win
        else "accuracy (the paper's score)"
    )
    return [f"- The same against {score}, `{settings.readout}` readout: " + "; ".join(parts) + "."]


def power_line(row: pd.Series) -> str:
    """What the comparison's n can answer: its power at the paper's r and the smallest r it
    detects with 80% power, and where the comparison sized for the paper's r is run."""
    return (
        f"- What n = {int(row['n'])} units can answer: power {_fmt(row['power_at_paper_r'], '.2f')} "
        f"to detect the paper's r(JER, binding) at the test's level; the smallest |r| detected "
        f"with 80% power is {_fmt(row['r_detectable_80'], '.2f')}. The comparison sized for the "
        "paper's r is the on-request target `binding_families` (its pre-registered design, "
        "power and measured time: docs/binding.md)."
    )


def model_sections(
    everything: pd.DataFrame,
    table: pd.DataFrame,
    controls: pd.DataFrame,
    tables: Mapping[str, Any],
    settings: StatsSettings,
) -> list[str]:
    """The trained models and the controls at the final layer, then (with the depth profiles)
    every model and control with intervals and JER by tap."""
    columns = [c for c in MODEL_COLUMNS if c in table]
    lines = ["## Models (final layer)", "", markdown_table(table[columns]), ""]
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
    return lines


def zoo_section(zoo: pd.DataFrame) -> list[str]:
    """Steps and first and final loss of each zoo objective."""
    last = (
        zoo.sort_values("step")
        .groupby("objective")
        .agg(steps=("step", "max"), first_loss=("loss", "first"), final_loss=("loss", "last"))
        .reset_index()
    )
    return [
        "## Zoo training (results/zoo/<objective>/curve.csv)",
        "",
        markdown_table(last, ".4g"),
        "",
    ]

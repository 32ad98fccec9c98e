"""The binding dose series: binding manipulated by a declared factor, and what follows it.

A presence-supervised backbone is also told the slot labels through a second head weighted by
the dose lambda (``zoo.hparams.supervised.slot_weight``; ``L = L_presence + lambda * L_slots``).
The dose is set before training, so binding varies across the series for a named reason, unlike
across the objective families. The question: when binding rises with the dose, do JER and the
geometry metrics rise with it? Within the series, each metric's Pearson and Spearman correlation
with binding is bootstrapped over the series' models (repdiag.common.statistics.correlation).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding.analysis.columns import l_iso_columns
from repdiag.common import statistics as stats
from repdiag.common.tables import format_number, markdown_table

SERIES = "dose series"


def series_metrics(table: pd.DataFrame) -> list[str]:
    """The metrics set against binding within the series: JER (the headline formula), the
    geometry metrics the paper says do not track binding (G.PR, G.Iso, every L.Iso k), and
    Same/Different."""
    columns = ["jer", "g_pr", "g_iso", *l_iso_columns(table), "same_different"]
    return [c for c in columns if c in table.columns]


def dose_series(table: pd.DataFrame) -> pd.DataFrame:
    """The models of the series (a finite ``dose``: presence runs at lambda = 0 and every
    ``binding_dose`` run), ordered by dose, seed and step."""
    if "dose" not in table:
        return table.iloc[0:0]
    series = table[np.isfinite(table["dose"].to_numpy(float))]
    order = [c for c in ("dose", "seed", "step") if c in series]
    return series.sort_values(order, kind="stable").reset_index(drop=True)


def dose_correlations(table: pd.DataFrame, options: dict[str, Any]) -> pd.DataFrame:
    """``dose_series.csv``: one row per metric, its correlation with binding within the series,
    and the span the dose produced (binding and dose, min to max) beside it."""
    series = dose_series(table)
    metrics = series_metrics(table)
    if series.empty:
        nothing = pd.DataFrame({c: [np.nan] for c in ("binding", *metrics)})
        frame = stats.correlation_table(nothing, "binding", metrics, **options)
        frame["note"] = "no dose series in this config (zoo.hparams.supervised.slot_weight)"
    else:
        frame = stats.correlation_table(series, "binding", metrics, **options)
    frame.insert(0, "models", SERIES)
    frame["n_doses"] = int(series["dose"].nunique()) if len(series) else 0
    for column in ("binding", "dose"):
        values = series[column].to_numpy(float) if column in series else np.array([])
        frame[f"{column}_min"] = float(values.min()) if values.size else np.nan
        frame[f"{column}_max"] = float(values.max()) if values.size else np.nan
    return frame


def _interval(row: pd.Series, column: str) -> str:
    low, high = row.get(f"{column}_ci_low", np.nan), row.get(f"{column}_ci_high", np.nan)
    value = format_number(row[column])
    if not (np.isfinite(low) and np.isfinite(high)):
        return value
    return f"{value} [{format_number(low, '.2f')}, {format_number(high, '.2f')}]"


def dose_markdown(
    models: pd.DataFrame, correlations: pd.DataFrame, binding_column: str, confidence: float
) -> list[str]:
    """The summary's dose-series section: what was manipulated, every model of the series with
    its binding interval, and each metric's correlation with binding within the series."""
    series = dose_series(models)
    lines = ["## Binding dose series (binding manipulated; apart from the families)", ""]
    if series.empty:
        return [*lines, "No dose series in this config (zoo.hparams.supervised.slot_weight).", ""]
    lines += [
        f"{len(series)} models at {series['dose'].nunique()} doses: a presence-supervised "
        "backbone told the slot labels through a second head weighted by lambda "
        "(L = L_presence + lambda * L_slots; lambda = 0 is the presence run). Binding spans "
        f"{format_number(series['binding'].min())} to {format_number(series['binding'].max())}.",
        "",
    ]
    l_iso = [c for c in series_metrics(series) if c.startswith("l_iso")][:1]
    rows = [
        {
            "model": row["model"],
            "lambda": format_number(row["dose"], "g"),
            "seed": format_number(row.get("seed", np.nan), ".0f"),
            "step": format_number(row.get("step", np.nan), ".0f"),
            f"binding ({confidence:.0%} CI)": _interval(row, binding_column),
            "JER": format_number(row["jer"], ".2f"),
            "G.PR": format_number(row.get("g_pr", np.nan)),
            "G.Iso": format_number(row.get("g_iso", np.nan), ".2f"),
            **{f"L.Iso k={c[7:]}": format_number(row[c], ".2f") for c in l_iso},
        }
        for _, row in series.iterrows()
    ]
    lines += [markdown_table(pd.DataFrame(rows)), ""]
    corr = [
        {
            "metric vs binding": row["metric"],
            "n": int(row["n"]),
            f"Pearson r ({confidence:.0%} CI)": f"{format_number(row['pearson_r'])} "
            f"[{format_number(row['pearson_ci_low'], '.2f')}, "
            f"{format_number(row['pearson_ci_high'], '.2f')}]",
            "Spearman rho": format_number(row["spearman_rho"]),
            "note": row.get("note") if isinstance(row.get("note"), str) else "",
        }
        for _, row in correlations.iterrows()
    ]
    return [*lines, "Within the series:", "", markdown_table(pd.DataFrame(corr)), ""]


def _final_checkpoints(series: pd.DataFrame) -> pd.DataFrame:
    """One row per (dose, seed): the model that trained the most steps."""
    return series.sort_values("step").groupby(["dose", "seed"], as_index=False).last()


def dose_figure(
    models: pd.DataFrame, *, binding_column: str = "binding", chance: float | None = None
) -> Any:
    """Three panels: binding against the dose (one line per seed, final checkpoints), JER
    against binding within the series (Pearson r), and binding and JER against the training
    step for each run with checkpoints."""
    import matplotlib.pyplot as plt

    from repdiag.common.figures import cycle_colour, interval_yerr

    series = dose_series(models)
    fig, axes = plt.subplots(1, 3, figsize=(13.0, 4.0), layout="constrained")
    dose_ax, jer_ax, step_ax = axes
    if series.empty:
        for ax in axes:
            ax.text(0.5, 0.5, "no dose series in this config", ha="center", transform=ax.transAxes)
        return fig
    final = _final_checkpoints(series)
    for i, (seed, rows) in enumerate(final.groupby("seed")):
        rows = rows.sort_values("dose")
        low = rows.get(f"{binding_column}_ci_low", rows["binding"])
        high = rows.get(f"{binding_column}_ci_high", rows["binding"])
        dose_ax.errorbar(
            rows["dose"],
            rows["binding"],
            yerr=interval_yerr(rows["binding"], low, high),
            marker="o",
            capsize=2,
            color=cycle_colour(i),
            label=f"seed {seed:.0f}",
        )
    dose_ax.set_xscale("symlog", linthresh=0.01)
    dose_ax.set(xlabel="dose lambda (weight of the slot labels)", ylabel="binding accuracy")
    r, _, n = stats.pearson(series["jer"].to_numpy(float), series["binding"].to_numpy(float))
    scatter = jer_ax.scatter(
        series["binding"], series["jer"], c=np.log10(series["dose"] + 1e-3), cmap="viridis"
    )
    fig.colorbar(scatter, ax=jer_ax, label="log10(lambda + 0.001)")
    jer_ax.set(
        xlabel="binding accuracy",
        ylabel="JER (effective rank, directions)",
        title=f"within the series: r = {format_number(r, '.2f')} (n = {n})",
    )
    step_twin = step_ax.twinx()
    runs = [(key, rows) for key, rows in series.groupby(["dose", "seed"]) if len(rows) > 1]
    for i, ((dose, seed), rows) in enumerate(runs):
        rows = rows.sort_values("step")
        label = f"lambda {dose:g}, seed {seed:.0f}"
        step_ax.plot(rows["step"], rows["binding"], marker="o", color=cycle_colour(i), label=label)
        step_twin.plot(rows["step"], rows["jer"], marker="s", linestyle="--", color=cycle_colour(i))
    if not runs:
        step_ax.text(0.5, 0.5, "no checkpoints (stop_at)", ha="center", transform=step_ax.transAxes)
    step_ax.set(xlabel="training step", ylabel="binding accuracy (solid)")
    step_twin.set_ylabel("JER (dashed)")
    for ax in (dose_ax, step_ax):
        if chance is not None and np.isfinite(chance):
            ax.axhline(chance, color="black", linestyle=":", linewidth=1, label="chance")
        ax.legend(fontsize=7)
    fig.suptitle("Binding dose series: presence labels + lambda x slot labels")
    return fig

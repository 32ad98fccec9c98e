"""Figures of the binding study (matplotlib, Agg), saved as PNG and PDF of a fixed pixel size.

One colour per objective family (:data:`repdiag.common.figures.FAMILY_COLOURS`); readouts are
told apart by grey level and hatching so that they never compete with the family colours.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import xarray as xr
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from repdiag.binding import (
    APART_FAMILIES,
    BINDING_DOSE_FAMILY,
    BINDING_SUPERVISED_FAMILY,
    CONTROL_FAMILY,
    JER_INTERVENTION_FAMILY,
)
from repdiag.binding.analysis.columns import metric_label
from repdiag.binding.analysis.units import saved_steps, unit_means
from repdiag.binding.metrics.readouts import WIN_RATE_CHANCE
from repdiag.common.figures import FAMILY_COLOURS, OKABE_ITO, family_colour
from repdiag.common.statistics import pearson
from repdiag.core.store import atomic_path

READOUT_STYLES = {
    "cosine": {"color": "#333333", "hatch": ""},
    "knn": {"color": "#888888", "hatch": "//"},
    "local_pca": {"color": "#DDDDDD", "hatch": ".."},
}
READOUT_NAMES = {"cosine": "cosine", "knn": "kNN", "local_pca": "local PCA"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
UNITS = {
    "g_pr": "fraction of dimension",
    "g_iso": "unitless, 0-1",
    "effective_rank": "dimensions",
    "participation_ratio": "dimensions",
    "jer": "effective rank, directions",
    "same_different": "fraction correct",
}


def axis_label(column: str) -> str:
    """Axis label with unit: ``G.Iso (unitless, 0-1)``."""
    unit = UNITS.get(column)
    if unit is None and column.startswith("l_iso"):
        unit = "unitless, 0-1"
    if unit is None and column.startswith("jer_"):
        unit = "effective rank, directions"
    return f"{metric_label(column)} ({unit})" if unit else metric_label(column)


APART_MARKERS = {
    CONTROL_FAMILY: "x",
    BINDING_SUPERVISED_FAMILY: "*",
    BINDING_DOSE_FAMILY: "D",
    JER_INTERVENTION_FAMILY: "s",
}
APART_LABELS = {
    CONTROL_FAMILY: "control (not in fits)",
    BINDING_SUPERVISED_FAMILY: "told the binding (not in fits)",
    BINDING_DOSE_FAMILY: "binding dose series (not in fits)",
    JER_INTERVENTION_FAMILY: "JER regularised (not in fits)",
}


def family_handles(families: Sequence[str]) -> list[Line2D]:
    """Legend entries: one marker in each family's colour (a cross for the controls)."""
    return [
        Line2D(
            [],
            [],
            color=family_colour(f),
            marker=APART_MARKERS.get(f, "o"),
            markeredgecolor="black" if f == BINDING_SUPERVISED_FAMILY else None,
            linestyle="",
            label=APART_LABELS.get(f, f.replace("_", " ")),
        )
        for f in families
    ]


def _families(table: pd.DataFrame) -> list[str]:
    return sorted(
        table["family"].astype(str).unique(),
        key=lambda f: list(FAMILY_COLOURS).index(f) if f in FAMILY_COLOURS else 99,
    )


def _scatter_family(
    ax: Any, table: pd.DataFrame, family: str, x: np.ndarray, y: np.ndarray, inside: np.ndarray
) -> None:
    """One family's points: final networks filled, steps saved inside a run hollow."""
    rows = (table["family"] == family).to_numpy()
    control = family == CONTROL_FAMILY
    colour = family_colour(family)
    for chosen, hollow in ((rows & ~inside, False), (rows & inside, True)):
        if not chosen.any():
            continue
        edge = None if control else "black" if family in APART_FAMILIES else "white"
        ax.scatter(
            x[chosen],
            y[chosen],
            color=colour,
            facecolor="none" if hollow else colour,
            marker=APART_MARKERS.get(family, "o"),
            s=60 if family == BINDING_SUPERVISED_FAMILY else 28,
            edgecolor=colour if hollow else edge,
            linewidth=1.0 if control or hollow else 0.5,
            zorder=3,
        )


def _saved_step_handle() -> Line2D:
    return Line2D(
        [],
        [],
        color="#444444",
        marker="o",
        markerfacecolor="none",
        linestyle="",
        label="step saved inside a run (not in the fit)",
    )


def _draw_fit(ax: Any, units: pd.DataFrame, metric: str, target: str) -> str:
    """Draw the least-squares line of ``target`` on ``metric`` over the objectives (each the
    mean of its seeds; controls and the families apart never enter it); return the r/p label."""
    x_unit, y_unit = units[metric].to_numpy(float), units[target].to_numpy(float)
    r, p, n = pearson(x_unit, y_unit)
    mask = np.isfinite(x_unit) & np.isfinite(y_unit)
    if np.isfinite(r):
        slope, intercept = np.polyfit(x_unit[mask], y_unit[mask], 1)
        xs = np.linspace(x_unit[mask].min(), x_unit[mask].max(), 50)
        ax.plot(
            xs,
            intercept + slope * xs,
            color="#444444",
            linewidth=1.2,
            zorder=2,
            label="OLS fit",
        )
        runs = int(units.loc[mask, "n_runs"].sum())
        return f"r = {r:.2f}, p = {p:.2g}\nn = {n} objectives ({runs} runs)"
    return f"r undefined\nn = {n}"


def scatter_grid(
    table: pd.DataFrame,
    metrics: Sequence[str],
    target: str = "binding",
    *,
    target_label: str = "binding accuracy (fraction correct)",
    chance: float | None = None,
    ncols: int = 3,
) -> Figure:
    """One panel per metric: models coloured by family against ``target``; the least-squares
    line, r and p over the objectives (each the mean of its seeds' final networks,
    :func:`unit_means`). A step saved inside a run (:func:`saved_steps`) is drawn hollow and
    stays out of the fit: it is its run's, not another unit."""
    metrics = list(metrics)
    nrows = max(1, math.ceil(len(metrics) / ncols))
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(3.6 * ncols, 3.0 * nrows + 0.6), squeeze=False, layout="constrained"
    )
    y_all = table[target].to_numpy(float)
    inside = saved_steps(table).to_numpy()
    trained = (~table["family"].isin(APART_FAMILIES)).to_numpy()
    units = unit_means(table[trained & ~inside], "the scatter's least-squares fit")
    for ax, metric in zip(axes.flat, metrics, strict=False):
        x_all = table[metric].to_numpy(float)
        for family in _families(table):
            _scatter_family(ax, table, family, x_all, y_all, inside)
        text = _draw_fit(ax, units, metric, target)
        ax.text(
            0.03,
            0.97,
            text,
            transform=ax.transAxes,
            va="top",
            fontsize=8,
            bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0},
        )
        if chance is not None and np.isfinite(chance):
            ax.axhline(
                chance, color="#999999", linestyle="--", linewidth=1, zorder=1, label="chance"
            )
        ax.set_xlabel(axis_label(metric), fontsize=8)
        ax.set_ylabel(target_label, fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.set_axis_off()
    handles = family_handles(_families(table))
    if inside.any():
        handles.append(_saved_step_handle())
    handles.append(Line2D([], [], color="#444444", linewidth=1.2, label="least-squares fit"))
    if chance is not None and np.isfinite(chance):
        handles.append(Line2D([], [], color="#999999", linestyle="--", label="chance"))
    fig.legend(
        handles=handles,
        title="objective family (points) and lines",
        loc="outside lower center",
        ncols=4,
        fontsize=7,
        title_fontsize=8,
    )
    fig.suptitle(
        f"Metrics against {target_label.split(' (')[0]} (points: models; fit and r: objectives, "
        "seeds averaged)",
        fontsize=10,
    )
    return fig


def spectra_figure(spectra: pd.DataFrame, *, layer: str | None = None) -> Figure:
    """Mean normalised singular values s_i / s_1 against rank i, one line per model.

    ``layer`` None takes each model's deepest layer.
    """
    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    styles = _model_styles(spectra)
    for model, part in spectra.groupby("model", sort=False):
        chosen = (
            part[part["layer"] == layer]
            if layer is not None
            else part[part["layer_index"] == part["layer_index"].max()]
        )
        chosen = chosen.sort_values("rank")
        colour, marker = styles[model]
        values = chosen["sv_normalised"].to_numpy(float)
        ax.plot(
            chosen["rank"],
            np.where(values > 0, values, np.nan),  # exact zeros (rank-deficient) off the log axis
            color=colour,
            marker=marker,
            markersize=3,
            linewidth=1.3,
            label=f"{model} ({chosen['layer'].iloc[0] if len(chosen) else '-'})",
        )
    ax.set_yscale("log")
    ax.set_xlabel("singular value index i (rank)")
    ax.set_ylabel("normalised singular value s_i / s_1 (unitless)")
    ax.set_title("Jacobian singular value spectra (mean over probe images)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="model (layer), colour = family", fontsize=7, title_fontsize=8, ncols=2)
    return fig


def _model_styles(frame: pd.DataFrame) -> dict[str, tuple[str, str]]:
    """Family colour and a marker that tells the models of one family apart."""
    styles, seen = {}, {}
    for model, family in (
        frame[["model", "family"]].drop_duplicates("model").itertuples(index=False)
    ):
        count = seen.get(family, 0)
        seen[family] = count + 1
        styles[model] = (family_colour(family), MARKERS[count % len(MARKERS)])
    return styles


def depth_figure(depth: pd.DataFrame, *, formula: str, probe_set: str) -> Figure:
    """Mean JER per layer against relative depth (0 = first tap, 1 = last), one line per model."""
    part = depth[(depth["formula"] == formula) & (depth["probe_set"] == probe_set)]
    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    styles = _model_styles(part)
    for model, rows in part.groupby("model", sort=False):
        rows = rows.sort_values("layer_index")
        colour, marker = styles[model]
        ax.plot(
            rows["relative_depth"],
            rows["jer_mean"],
            color=colour,
            marker=marker,
            markersize=4,
            linewidth=1.3,
            label=model,
        )
        if rows["jer_ci_low"].notna().any():
            ax.fill_between(
                rows["relative_depth"],
                rows["jer_ci_low"],
                rows["jer_ci_high"],
                color=colour,
                alpha=0.12,
                linewidth=0,
            )
    ax.set_xlabel("relative depth (layer index / last index)")
    ax.set_ylabel(f"JER, {formula} formula (effective rank, directions)")
    ax.set_title(
        f"Depth profile of the Jacobian effective rank ({probe_set} probe images)", fontsize=10
    )
    ax.set_xlim(-0.02, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(title="model, colour = family", fontsize=7, title_fontsize=8, ncols=2)
    return fig


SCORES = (  # (column suffix, axis label, panel title)
    ("", "binding accuracy (fraction correct)", "Binding accuracy by readout at the final layer"),
    ("_win", "binding win rate (share of wrong candidates beaten)", "Binding win rate by readout"),
)


def readout_figure(
    table: pd.DataFrame,
    readouts: Sequence[str] = ("cosine", "knn", "local_pca"),
    *,
    chance: float | None = None,
) -> Figure:
    """Binding per model for each readout (bars, interval whiskers): accuracy with its chance
    line (``chance``, 1 / n_candidates) above, the win rate with its chance line 1/2 below
    (when the table has it)."""
    readouts = [r for r in readouts if table.get(f"binding_{r}", pd.Series()).notna().any()]
    scores = [score for score in SCORES if any(f"binding_{r}{score[0]}" in table for r in readouts)]
    # trained models first, controls after them, apart
    table = pd.concat(
        [table[~table["family"].isin(APART_FAMILIES)], table[table["family"].isin(APART_FAMILIES)]]
    )
    n = len(table)
    fig, axes = plt.subplots(
        len(scores), 1, figsize=(max(6.5, round(0.75 * n + 2.0) + 0.5), 3.4 * len(scores) + 1.0),
        layout="constrained", squeeze=False, sharex=True,
    )  # fmt: skip
    for ax, (suffix, label, title) in zip(axes[:, 0], scores, strict=True):
        level = chance if suffix == "" else WIN_RATE_CHANCE
        _readout_bars(ax, table, readouts, suffix, level)
        ax.set_ylabel(label, fontsize=8)
        ax.set_title(title, fontsize=10)
    ax = axes[-1, 0]
    ax.set_xticks(np.arange(n), table["model"].astype(str), rotation=35, ha="right", fontsize=8)
    for tick, family in zip(ax.get_xticklabels(), table["family"], strict=True):
        tick.set_color(family_colour(str(family)))
    ax.set_xlabel("model (label colour = objective family)")
    axes[0, 0].legend(title="readout", fontsize=8, title_fontsize=8, ncols=2, loc="upper left")
    fig.legend(
        handles=family_handles(_families(table)),
        title="objective family",
        loc="outside right upper",
        fontsize=7,
        title_fontsize=8,
    )
    return fig


def _readout_bars(
    ax: Any, table: pd.DataFrame, readouts: Sequence[str], suffix: str, chance: float | None
) -> None:
    """One panel of :func:`readout_figure`: the columns ``binding_<readout><suffix>``."""
    n = len(table)
    n_trained = int((~table["family"].isin(APART_FAMILIES)).sum())
    width = 0.8 / max(1, len(readouts))
    x = np.arange(n)
    nan = pd.Series(np.nan, index=table.index)
    for i, readout in enumerate(readouts):
        column = f"binding_{readout}{suffix}"
        values = table.get(column, nan).to_numpy(float)
        low = table.get(f"{column}_ci_low", nan).to_numpy(float)
        high = table.get(f"{column}_ci_high", nan).to_numpy(float)
        errors = np.vstack([np.clip(values - low, 0, None), np.clip(high - values, 0, None)])
        errors = np.where(np.isfinite(errors), errors, 0.0)
        style = READOUT_STYLES.get(readout, {"color": "#555555", "hatch": "xx"})
        ax.bar(
            x + (i - (len(readouts) - 1) / 2) * width, values, width,
            color=style["color"], hatch=style["hatch"], edgecolor="black", linewidth=0.5,
            yerr=errors, capsize=2, error_kw={"linewidth": 0.8},
            label=READOUT_NAMES.get(readout, readout),
        )  # fmt: skip
    if chance is not None and np.isfinite(chance):
        ax.axhline(
            chance, color="#000000", linestyle="--", linewidth=1.2, label=f"chance ({chance:.3f})"
        )
    if 0 < n_trained < n:
        ax.axvline(n_trained - 0.5, color="#999999", linewidth=1.0)
        ax.text(
            n_trained - 0.4, 0.97, "controls, told the binding", fontsize=8, color="#666666",
            va="top", bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85},
        )  # fmt: skip
    ax.set_ylim(0, 1.0)


def _show(ax: Any, image: np.ndarray, title: str, edge: str, width: float, colour: str) -> None:
    ax.imshow(image, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=7, color=colour)
    for spine in ax.spines.values():
        spine.set_edgecolor(edge)
        spine.set_linewidth(width)


def contact_sheet(ds: xr.Dataset, path: str | os.PathLike[str], n_queries: int = 4) -> None:
    """PNG of the first ``n_queries`` query/candidate sets, the correct candidate framed in green,
    and a last row of "different" Same/Different pairs (member 0 next to member 1)."""
    correct_colour = OKABE_ITO[2]  # bluish green
    pair_colour = OKABE_ITO[5]  # vermillion
    n_rows = min(n_queries, ds.sizes["query"])
    n_c = ds.sizes["candidate"]
    n_cols = n_c + 1
    different = np.flatnonzero(np.asarray(ds["pair_same"].values) == 0)[: n_cols // 2]
    fig, axes = plt.subplots(
        n_rows + 1, n_cols, figsize=(1.3 * n_cols, 1.45 * (n_rows + 1) + 0.9), squeeze=False
    )
    for row in range(n_rows):
        correct = int(ds["correct_index"].values[row])
        _show(axes[row, 0], ds["query_image"].values[row], "query", "0.6", 0.5, "black")
        for c in range(n_c):
            is_correct = c == correct
            _show(
                axes[row, c + 1],
                ds["candidate_image"].values[row, c],
                f"c{c}" + (" (correct)" if is_correct else ""),
                correct_colour if is_correct else "0.6",
                4 if is_correct else 0.5,
                correct_colour if is_correct else "black",
            )
        axes[row, 0].set_ylabel(str(ds["query"].values[row]), fontsize=8)
    pair_row = axes[n_rows]
    for col in range(n_cols):
        pair_row[col].axis("off")
    for i, p in enumerate(different):
        for member in (0, 1):
            ax = pair_row[2 * i + member]
            ax.axis("on")
            title = f"{ds['pair'].values[p]} m{member}"
            _show(ax, ds["pair_image"].values[p, member], title, pair_colour, 2, pair_colour)
    pair_row[0].set_ylabel("different", fontsize=8)
    legend = [
        Patch(facecolor="none", edgecolor=correct_colour, linewidth=3,
              label="candidate with the query's shape-to-slot arrangement"),
        Patch(facecolor="none", edgecolor=pair_colour, linewidth=2,
              label="a 'different' pair: same shapes and slots, another arrangement"),
    ]  # fmt: skip
    fig.legend(handles=legend, loc="lower center", fontsize=8, frameon=False, ncols=2)
    fig.suptitle(
        f"Attribute binding: query (query palette) vs {n_c} candidates (target palette), "
        f"chance {1 / n_c:.1%}; last row: Same/Different pairs labelled different",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)

"""Figures of the alignment study (PNG at 150 dpi and PDF), Okabe-Ito colour-blind-safe palette."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from repdiag.common.figures import cycle_colour, save_figure

METRICS = {
    "tr_intervention": "M_tr (intervention)",
    "cont_intervention": "M_cont (intervention)",
    "concept_match": "concepts on the same latent",
    "explained_variance": "M_extract: explained variance",
    "mcc": "M_extract: MCC vs concepts",
    "tr_r2": "M_tr: translation R²",
    "tr_cosine": "M_tr: translation cosine",
    "jaccard": "M_cont: active-set Jaccard",
    "code_correlation": "M_cont: code correlation (firing-weighted)",
    "probe_transfer": "M_cont: probe transfer accuracy",
    "cycle_r2": "cycle consistency R²",
}
FRACTION_METRICS = ("tr_intervention", "cont_intervention", "tr_r2", "jaccard")
VARIANT_ORDER = (
    "independent",
    "sae_a",
    "crosscoder",
    "usae",
    "cosae-translation",
    "cosae-consistency",
    "cosae-distributional",
    "cosae-all",
)


def _variants(table: pd.DataFrame) -> list[str]:
    """Variants in the study's order (baselines, then CoSAE ablations), unknown ones last."""
    present = list(dict.fromkeys(table["variant"]))
    known = [v for v in VARIANT_ORDER if v in present]
    return known + [v for v in present if v not in known]


def _colours(variants: Sequence[str]) -> dict[str, str]:
    return {v: cycle_colour(i) for i, v in enumerate(variants)}


def _seed_stats(rows: pd.DataFrame, column: str) -> tuple[float, float]:
    values = rows[column].astype(float).dropna()
    if values.empty:
        return float("nan"), 0.0
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def methods_figure(table: pd.DataFrame, png: str | Path, pdf: str | Path) -> None:
    """One panel per metric; bars per variant at the largest paired fraction (pair-free at 0)."""
    synthetic = table[table["data"] == "synthetic"]
    variants = _variants(synthetic)
    colours = _colours(variants)
    fraction = synthetic.loc[synthetic["paired_fraction"] > 0, "paired_fraction"].max()
    metrics = [m for m in METRICS if m in synthetic and synthetic[m].notna().any()]
    ncols = 4
    nrows = int(np.ceil(len(metrics) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols, 3.0 * nrows + 0.6), squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        for i, variant in enumerate(variants):
            rows = synthetic[synthetic["variant"] == variant]
            rows = (
                rows[np.isclose(rows["paired_fraction"], fraction)]
                if (rows["paired_fraction"] > 0).any()
                else rows
            )
            mean, std = _seed_stats(rows, metric)
            ax.bar(i, mean, yerr=std, color=colours[variant], capsize=3)
        ax.set_title(METRICS[metric], fontsize=9)
        ax.set_xticks(range(len(variants)))
        ax.set_xticklabels(variants, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("score (unitless)", fontsize=8)
        ax.axhline(0, color="0.5", linewidth=0.6)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    fig.suptitle(
        f"Alignment methods on synthetic concepts (paired fraction {fraction:g}; "
        "pair-free variants at 0; mean ± sd over seeds)",
        fontsize=10,
    )
    fig.tight_layout()
    save_figure(fig, png, pdf)


def paired_fraction_figure(table: pd.DataFrame, png: str | Path, pdf: str | Path) -> None:
    """Metrics against the paired fraction (log axis); pair-free variants as dashed lines."""
    synthetic = table[table["data"] == "synthetic"]
    variants = _variants(synthetic)
    colours = _colours(variants)
    fractions = sorted(f for f in synthetic["paired_fraction"].unique() if f > 0)
    fig, axes = plt.subplots(
        1, len(FRACTION_METRICS), figsize=(3.6 * len(FRACTION_METRICS), 4.2), squeeze=False
    )
    for ax, metric in zip(axes.flat, FRACTION_METRICS, strict=True):
        if metric not in synthetic or synthetic[metric].isna().all():
            ax.set_title(f"{METRICS[metric]}: not computed", fontsize=9)
            continue
        for variant in variants:
            rows = synthetic[synthetic["variant"] == variant]
            if (rows["paired_fraction"] > 0).any():
                stats = [
                    _seed_stats(rows[np.isclose(rows["paired_fraction"], f)], metric)
                    for f in fractions
                ]
                means, stds = zip(*stats, strict=True)
                ax.errorbar(
                    fractions,
                    means,
                    yerr=stds,
                    marker="o",
                    color=colours[variant],
                    label=variant,
                    capsize=3,
                )
            else:
                mean, _ = _seed_stats(rows, metric)
                ax.axhline(
                    mean, linestyle="--", color=colours[variant], label=f"{variant} (no pairs)"
                )
        ax.set_xscale("log")
        ax.set_xlabel("paired fraction of training rows (log scale)")
        ax.set_ylabel("score (unitless)", fontsize=8)
        ax.set_title(METRICS[metric], fontsize=9)
    fig.suptitle(
        "Alignment against the paired (anchor) fraction, mean ± sd over seeds", fontsize=10
    )
    fig.tight_layout(rect=(0, 0.16, 1, 1))  # room for the legend below the panels
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="lower center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(len(labels), 4),
        fontsize=8,
        frameon=False,
    )
    save_figure(fig, png, pdf)


REAL_METRICS = (
    "tr_intervention",
    "cont_intervention",
    "concept_match",
    "tr_r2",
    "probe_transfer",
    "cycle_r2",
)


def real_figure(table: pd.DataFrame, png: str | Path, pdf: str | Path) -> None:
    """Per real pair (rows) and metric (columns): bars per variant, one per paired fraction.

    Bars are the mean over seeds and whiskers the seed minimum and maximum (each seed: its own
    split and SAE initialisation); the intervention metrics intervene on the images' known slot
    attributes (:mod:`repdiag.alignment.interventions`); control pairs carry the exact
    translator's bar (``exact-translator``), each metric's ceiling.
    """
    real = table[table["data"] == "real"]
    if real.empty:
        raise ValueError("the alignment table has no real-embedding rows (alignment.real.pairs)")
    pairs = list(dict.fromkeys(real["pair"]))
    metrics = [m for m in REAL_METRICS if m in real and real[m].notna().any()]
    fractions = sorted(real["paired_fraction"].unique())
    colours = {f: cycle_colour(i) for i, f in enumerate(fractions)}
    width = 0.8 / len(fractions)
    fig, axes = plt.subplots(
        len(pairs),
        len(metrics),
        figsize=(3.3 * len(metrics), 3.2 * len(pairs) + 0.9),
        squeeze=False,
    )
    for row, pair in enumerate(pairs):
        rows = real[real["pair"] == pair]
        variants = _variants(rows)
        for ax, metric in zip(axes[row], metrics, strict=True):
            for k, fraction in enumerate(fractions):
                at = rows[np.isclose(rows["paired_fraction"], fraction)]
                values = [at.loc[at["variant"] == v, metric].astype(float) for v in variants]
                means = np.array([v.mean() if v.notna().any() else np.nan for v in values])
                spread = np.array(
                    [[means[i] - v.min(), v.max() - means[i]] for i, v in enumerate(values)]
                )
                positions = np.arange(len(variants)) + (k - (len(fractions) - 1) / 2) * width
                label = "no pairs" if fraction == 0 else f"{fraction:g} paired"
                ax.bar(
                    positions,
                    means,
                    width,
                    yerr=np.nan_to_num(spread.T),
                    color=colours[fraction],
                    label=label,
                    capsize=2,
                )
            ax.set_title(f"{METRICS[metric]}", fontsize=9)
            ax.set_xticks(range(len(variants)))
            ax.set_xticklabels(variants, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel("score (unitless)", fontsize=8)
            ax.axhline(0, color="0.5", linewidth=0.6)
        axes[row][0].annotate(
            pair.replace("__", " | "),
            xy=(0, 1.18),
            xycoords="axes fraction",
            fontsize=9,
            fontweight="bold",
        )
    fig.suptitle(
        "Alignment on real embeddings (mean over seeds, whiskers: seed min-max; M_tr: decoded "
        "interventions on the images' known slot attributes; control pairs: rotation ceiling, "
        "shuffle floor, exact translator)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    save_figure(fig, png, pdf)

"""Tables and figures of the identifiability study (no torch: runs in the analysis environment).

* :func:`aggregate` -- one row per condition (generator x sampling x encoder x loss x ratio) with
  the mean, standard deviation (ddof = 1), min and max over seeds of R^2, MCC and APE.
* :func:`paper_comparison` -- the paper's headline numbers (``claims.yaml``) and, for the
  MLP with diversity violated, each generator's expected value, next to every seed of ours.
* :func:`plot_r2`, :func:`plot_ratio` -- the two figures (PNG and PDF).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from repdiag.common.claims import Claim, study_claims
from repdiag.common.figures import OKABE_ITO, save_figure
from repdiag.common.units import Units, require_independent

CONDITION = ["generator", "sampling", "encoder", "loss", "ratio"]
METRICS = ("r2", "mcc", "ape")

CLAIMS = study_claims("identifiability")
# The paper's ranges (claims with a cell selection) and, per generator, the expected R^2 of the
# MLP with diversity violated: (mean, std over the authors' runs or None). A generator's cells
# "hold" against it when every seed lies in [mean - w, mean + w], w = max(std,
# EXPECTED_TOLERANCE); the tolerance is the project's choice, not the paper's.
PAPER_CLAIMS: tuple[Claim, ...] = tuple(c for c in CLAIMS if "expected_of" not in c.where)
EXPECTED_VIOLATED: dict[str, tuple[float, float | None]] = {
    c.where["generator"]: (c.value, None if math.isnan(c.spread) else c.spread)
    for c in CLAIMS
    if c.where.get("expected_of") == "mlp_violated"
}
EXPECTED_TOLERANCE = 0.1

# Okabe-Ito (Okabe and Ito 2008): distinguishable under common colour-vision deficiencies
CONDITION_STYLES = {
    ("mlp", "full"): (OKABE_ITO[4], "", "MLP, full support"),
    ("mlp", "restricted"): (OKABE_ITO[1], "//", "MLP, restricted support"),
    ("inverse", "full"): (OKABE_ITO[5], "", "inverse model, full support"),
    ("inverse", "restricted"): (OKABE_ITO[0], "//", "inverse model, restricted support"),
}
LINE_COLOURS = tuple(OKABE_ITO[i] for i in (4, 5, 2, 6, 0, 1, 7))


RUN_KEY = ["cell", "steps", "batch_size"]
"""A training run: its cell (condition and seed) at its steps and batch."""


def results_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per cell JSON: condition columns, seed, metrics, final loss, speed. Every row is
    one training run (the unit; its seed the block): a run listed twice is refused, naming it
    (:func:`repdiag.common.units.require_independent`)."""
    rows = []
    for record in records:
        row = {key: record[key] for key in ("cell", *CONDITION, "seed")}
        row |= {metric: record["metrics"][metric] for metric in METRICS}
        row |= {k: v for k, v in record["metrics"].items() if k.startswith("r2_z")}
        sampling = record.get("params", {}).get("sampling", {})
        row["n_fixed"] = sampling.get("n_fixed", 1) if record["sampling"] == "restricted" else 0
        row |= {
            key: record[key]
            for key in ("final_loss", "steps", "batch_size", "steps_per_s", "wall_time_s")
        }
        rows.append(row)
    if not rows:
        raise ValueError("no identifiability cell results to aggregate")
    frame = pd.DataFrame(rows)
    runs = [f"{c} ({s} steps, batch {b})" for c, s, b in frame[RUN_KEY].to_numpy()]
    units = Units(tuple(runs), tuple(map(str, frame["seed"])), "training run")
    require_independent(units, frame["cell"].astype(str).tolist(), "the identifiability tables")
    frame["ratio"] = frame["ratio"].astype(float)
    return frame


def aggregate(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean, std (ddof = 1; NaN for one seed), min and max over seeds per condition."""
    grouped = frame.groupby(CONDITION, dropna=False, sort=True)
    table = grouped.agg(
        n_seeds=("seed", "nunique"), steps=("steps", "first"), batch_size=("batch_size", "first")
    )
    for metric in METRICS:
        stats = grouped[metric].agg(["mean", "std", "min", "max"])
        stats.columns = [f"{metric}_{name}" for name in stats.columns]
        table = table.join(stats)
    for column in _coordinate_columns(frame):
        table[f"{column}_mean"] = grouped[column].mean()
        table[f"{column}_min"] = grouped[column].min()
        table[f"{column}_max"] = grouped[column].max()
    table["final_loss_mean"] = grouped["final_loss"].mean()
    return table.reset_index()


def _coordinate_columns(frame: pd.DataFrame) -> list[str]:
    """The per-coordinate R^2 columns r2_z1, r2_z2, ... present in ``frame``, in order."""
    columns = [c for c in frame.columns if c.startswith("r2_z") and c[4:].isdigit()]
    return sorted(columns, key=lambda c: int(c[4:]))


def _select(
    table: pd.DataFrame, encoder: str, sampling: str, loss: str, ratio: float | None
) -> pd.DataFrame:
    rows = table[(table.encoder == encoder) & (table.sampling == sampling) & (table.loss == loss)]
    if ratio is None:
        return rows[rows.ratio.isna()]
    return rows[np.isclose(rows.ratio, ratio)]


def _claim_row(subset: pd.DataFrame, low: float, high: float) -> dict[str, Any]:
    """Every seed's R^2, mean, std, min, max, per-coordinate means and the range test."""
    subset = subset.sort_values("seed")
    r2 = subset.r2.to_numpy(dtype=float)
    row: dict[str, Any] = {
        "n_cells": len(subset),
        "seeds": " ".join(str(int(s)) for s in subset.seed),
        "r2_per_seed": " ".join(f"{v:.3f}" for v in r2),
        "measured_r2": float(r2.mean()) if len(r2) else math.nan,
        "measured_r2_std": float(r2.std(ddof=1)) if len(r2) > 1 else math.nan,
        "measured_r2_min": float(r2.min()) if len(r2) else math.nan,
        "measured_r2_max": float(r2.max()) if len(r2) else math.nan,
        # "holds" only when every seed lies in the range, not just their mean
        "holds": bool(((r2 >= low) & (r2 <= high)).all()) if len(r2) else None,
        "seeds_in_range": int(((r2 >= low) & (r2 <= high)).sum()),
    }
    for column in _coordinate_columns(subset):
        row[f"{column}_mean"] = float(subset[column].mean()) if len(subset) else math.nan
    n_fixed = int(subset.n_fixed.max()) if "n_fixed" in subset and len(subset) else 0
    perturbed = [c for c in _coordinate_columns(subset) if int(c[4:]) > n_fixed]
    row["perturbed_r2_max"] = (
        float(subset[perturbed].to_numpy().max())
        if perturbed and n_fixed and len(subset)
        else math.nan
    )
    return row


def paper_comparison(frame: pd.DataFrame) -> pd.DataFrame:
    """The paper's R^2 claims against our cells: one row per claim and generator (plus ``all``),
    and for the violated MLP one more per generator against its own expected value.

    Rows with ``reference`` = "paper range" test every seed against the summary's range
    [paper_low, paper_high]; rows with ``reference`` = "expected" test every seed against the
    generator's expected value (:data:`EXPECTED_VIOLATED`, band [expected_low, expected_high]).
    ``holds`` is true only when all seeds lie in the band; ``r2_per_seed`` lists them (seed
    order of ``seeds``), ``perturbed_r2_max`` is the largest per-coordinate R^2 of the perturbed
    coordinates over seeds (restricted support). The support-corrected claim is listed at every
    ratio of the sweep, per generator; only ratio 1 has the paper's range (see
    :data:`PAPER_CLAIMS`) and an ``all`` row, the other ratios are compared with it for
    reference. Claims with no matching cell get n_cells = 0.
    """
    rows = []
    swept = set(frame.loc[frame.loss == "support_corrected", "ratio"].dropna())
    for paper_claim in PAPER_CLAIMS:
        claim, low, high = paper_claim.claim_id, paper_claim.low, paper_claim.high
        text = f"{paper_claim.statement}: {paper_claim.paper_text}"
        where = paper_claim.where
        encoder, sampling, loss, ratio = (
            where[k] for k in ("encoder", "sampling", "loss", "ratio")
        )
        claim_ratios = [ratio] if ratio is None else sorted(swept | {ratio})
        for claim_ratio in claim_ratios:
            cells = _select(frame, encoder, sampling, loss, claim_ratio)
            groups = [(g, c) for g, c in cells.groupby("generator", sort=True)]
            paper_ratio = ratio is None or np.isclose(claim_ratio, ratio)
            if paper_ratio:  # one "all" row per claim, at the paper's ratio
                groups.append(("all", cells))
            for generator, subset in groups:
                base = {
                    "claim": claim,
                    "paper": text,
                    "generator": generator,
                    "encoder": encoder,
                    "sampling": sampling,
                    "loss": loss,
                    "ratio": claim_ratio,
                }
                rows.append(
                    base
                    | {
                        "reference": "paper range" if paper_ratio else "paper range (other ratio)",
                        "paper_low": low,
                        "paper_high": high,
                    }
                    | _claim_row(subset, low, high)
                )
                if claim == "mlp_violated" and generator in EXPECTED_VIOLATED:
                    mean, std = EXPECTED_VIOLATED[generator]
                    width = max(std or 0.0, EXPECTED_TOLERANCE)
                    band = (max(mean - width, 0.0), min(mean + width, 1.0))
                    rows.append(
                        base
                        | {
                            "reference": "expected",
                            "expected_r2": mean,
                            "expected_std": std if std is not None else math.nan,
                            "expected_low": band[0],
                            "expected_high": band[1],
                        }
                        | _claim_row(subset, *band)
                    )
    return pd.DataFrame(rows)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_r2(table: pd.DataFrame, paths: Sequence[str | Path]) -> None:
    """Grouped bars: held-out linear R^2 per generator, one bar per (encoder, sampling), InfoNCE.

    Bars are means over seeds, error bars one standard deviation; the paper's thresholds are
    drawn as reference lines.
    """
    plt = _pyplot()
    infonce = table[table.loss == "infonce"]
    generators = sorted(infonce.generator.unique())
    conditions = [
        key
        for key in CONDITION_STYLES
        if ((infonce.encoder == key[0]) & (infonce.sampling == key[1])).any()
    ]
    fig, ax = plt.subplots(figsize=(8.0, 5.0), layout="constrained")
    width = 0.8 / max(len(conditions), 1)
    for index, (encoder, sampling) in enumerate(conditions):
        colour, hatch, label = CONDITION_STYLES[(encoder, sampling)]
        rows = infonce[(infonce.encoder == encoder) & (infonce.sampling == sampling)].set_index(
            "generator"
        )
        means = [rows.r2_mean.get(g, np.nan) for g in generators]
        errors = [np.nan_to_num(rows.r2_std.get(g, np.nan)) for g in generators]
        positions = np.arange(len(generators)) + (index - (len(conditions) - 1) / 2) * width
        ax.bar(
            positions,
            means,
            width,
            yerr=errors,
            capsize=3,
            color=colour,
            hatch=hatch,
            edgecolor="black",
            linewidth=0.5,
            label=label,
        )
        if (encoder, sampling) == ("mlp", "restricted"):  # each generator's expected value
            expected = [EXPECTED_VIOLATED.get(g, (np.nan, None)) for g in generators]
            ax.errorbar(
                positions,
                [mean for mean, _ in expected],
                yerr=[std or 0.0 for _, std in expected],
                fmt="D",
                color="black",
                markersize=4,
                capsize=2,
                label="expected, MLP violated (authors' 5000-step runs)",
            )
    ax.axhline(
        0.99,
        color="black",
        linestyle="--",
        linewidth=0.8,
        label="paper: MLP with diversity >= 0.99",
    )
    ax.axhline(
        0.88,
        color="black",
        linestyle=":",
        linewidth=0.8,
        label="paper: inverse model, violated >= 0.88",
    )
    ax.axhspan(0.05, 0.13, color="#999999", alpha=0.3, label="paper: MLP, violated 0.05-0.13")
    ax.set_xticks(np.arange(len(generators)), [g.replace("_", " ") for g in generators])
    ax.set_xlabel("generative process g")
    ax.set_ylabel("held-out linear R² (unitless)")
    ax.set_ylim(min(0.0, float(np.nanmin(infonce.r2_mean)) - 0.05) if len(infonce) else 0.0, 1.05)
    ax.set_title("Linear identifiability by generator and sampling condition (InfoNCE)")
    fig.legend(fontsize=7, loc="outside lower center", ncols=3)
    if not len(infonce):
        ax.text(0.5, 0.5, "no InfoNCE cells in the grid", transform=ax.transAxes, ha="center")
    save_figure(fig, *paths)


def plot_ratio(table: pd.DataFrame, paths: Sequence[str | Path]) -> None:
    """R^2 (mean +- std over seeds) against the constrained-negative ratio of support-corrected InfoNCE."""
    plt = _pyplot()
    sweep = table[table.loss == "support_corrected"].sort_values("ratio")
    fig, ax = plt.subplots(figsize=(6.5, 5.0), layout="constrained")
    for index, ((generator, encoder), rows) in enumerate(
        sweep.groupby(["generator", "encoder"], sort=True)
    ):
        colour = LINE_COLOURS[index % len(LINE_COLOURS)]
        std = np.nan_to_num(rows.r2_std.to_numpy())
        ax.errorbar(
            rows.ratio,
            rows.r2_mean,
            yerr=std,
            color=colour,
            marker="o",
            capsize=3,
            label=f"{encoder.upper() if encoder == 'mlp' else 'inverse model'} on {generator.replace('_', ' ')}",
        )
    ax.axhspan(
        0.60, 0.65, color=OKABE_ITO[2], alpha=0.25, label="paper: support-corrected MLP 0.60-0.65"
    )
    ax.axhspan(0.05, 0.13, color="#999999", alpha=0.3, label="paper: MLP, violated 0.05-0.13")
    ax.set_xlabel(
        "constrained-negative ratio (fraction of negatives on the positive's sub-manifold)"
    )
    ax.set_ylabel("held-out linear R² (unitless)")
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(0.0, 1.05)
    ax.set_title("Support-corrected InfoNCE under restricted support")
    if len(sweep):
        fig.legend(fontsize=7, loc="outside lower center", ncols=2)
    else:
        ax.text(
            0.5, 0.5, "no constrained-ratio sweep configured", transform=ax.transAxes, ha="center"
        )
    save_figure(fig, *paths)

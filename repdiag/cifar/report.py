"""Tables and figure of the CIFAR-10 SimCLR study (pandas and matplotlib; no torch).

``results/tables/cifar_simclr_runs.csv``: one row per run. ``results/tables/cifar_simclr.csv``:
long format with a ``kind`` column:

- ``accuracy``: per regime x architecture, linear-probe test accuracy over seeds: ``mean``,
  ``std`` (ddof = 1; empty with a note for one seed), ``min``, ``max``, ``rank`` within the regime
  (1 = best), ``delta_vs_reference`` = mean - the same architecture's mean in the reference regime
  (the first of ``cifar.regimes``, All by default): the effect of restricting the augmentations.
- ``gap``: per regime and pair of architectures "a - b" (a before b in ``cifar.architectures``,
  strongest inductive bias first): the seed-paired difference acc_a - acc_b, mean/std/min/max
  over the seeds both have; ``delta_vs_reference`` = gap(regime) - gap(reference regime) is the
  interaction of the paper (seed 002): positive when the gap widens as the diversity condition
  is violated more.
- ``spread``: per regime, best minus worst architecture mean ("best - worst" named in
  ``architecture``) and its change from the reference regime.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from repdiag.cifar.regimes import regime_label
from repdiag.common.figures import OKABE_ITO, save_figure

ARCHITECTURE_COLOURS = {"resnet18": OKABE_ITO[4], "vit": OKABE_ITO[0], "mlp": OKABE_ITO[2]}
PAIR_COLOURS = tuple(OKABE_ITO[i] for i in (6, 5, 1, 3, 7))
ARCHITECTURE_LABELS = {"resnet18": "ResNet-18", "vit": "ViT (4x4 patches)", "mlp": "MLP"}
RUN_COLUMNS = (
    "run",
    "architecture",
    "regime",
    "regime_label",
    "seed",
    "accuracy",
    "train_accuracy",
    "chance",
    "initial_loss",
    "final_loss",
    "steps",
    "epochs",
    "n_train",
    "n_test",
    "encoder_parameters",
    "device",
)
SUMMARY_COLUMNS = (
    "kind",
    "regime",
    "regime_label",
    "architecture",
    "n_seeds",
    "mean",
    "std",
    "min",
    "max",
    "rank",
    "delta_vs_reference",
    "reference_regime",
    "chance",
    "note",
)


def runs_table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per run record (the JSON of rule ``cifar_simclr``)."""
    rows = [
        {
            "run": r["run"],
            "architecture": r["architecture"],
            "regime": r["regime"],
            "regime_label": r["regime_label"],
            "seed": r["seed"],
            "accuracy": r["probe"]["accuracy"],
            "train_accuracy": r["probe"]["train_accuracy"],
            "chance": r["probe"]["chance"],
            "initial_loss": r["train"]["initial_loss"],
            "final_loss": r["train"]["final_loss"],
            "steps": r["train"]["steps"],
            "epochs": r["train"]["epochs"],
            "n_train": r["data"]["n_train"],
            "n_test": r["data"]["n_test"],
            "encoder_parameters": r["model"]["encoder_parameters"],
            "device": r["train"]["device"],
        }
        for r in records
    ]
    return pd.DataFrame(rows, columns=list(RUN_COLUMNS))


def _describe(values: np.ndarray) -> dict[str, Any]:
    n = len(values)
    return {
        "n_seeds": n,
        "mean": float(np.mean(values)) if n else np.nan,
        "std": float(np.std(values, ddof=1)) if n > 1 else np.nan,
        "min": float(np.min(values)) if n else np.nan,
        "max": float(np.max(values)) if n else np.nan,
        "note": "" if n > 1 else ("one seed: no spread" if n == 1 else "no runs"),
    }


def _accuracy_by_seed(runs: pd.DataFrame, regime: str, architecture: str) -> pd.Series:
    rows = runs[(runs["regime"] == regime) & (runs["architecture"] == architecture)]
    return rows.set_index("seed")["accuracy"].sort_index()


def summary_table(
    runs: pd.DataFrame, architectures: Sequence[str], regimes: Sequence[str]
) -> pd.DataFrame:
    """The ``accuracy``, ``gap`` and ``spread`` rows described in the module docstring."""
    reference = regimes[0]
    chance = float(runs["chance"].iloc[0]) if len(runs) else np.nan
    rows: list[dict[str, Any]] = []
    means: dict[tuple[str, str], float] = {}
    for regime in regimes:
        for arch in architectures:
            stats = _describe(_accuracy_by_seed(runs, regime, arch).to_numpy())
            means[regime, arch] = stats["mean"]
            rows.append({"kind": "accuracy", "regime": regime, "architecture": arch, **stats})
    gaps: dict[tuple[str, str], float] = {}
    for regime in regimes:
        for a, b in itertools.combinations(architectures, 2):
            acc_a, acc_b = _accuracy_by_seed(runs, regime, a), _accuracy_by_seed(runs, regime, b)
            paired = (acc_a - acc_b).dropna()  # aligned on seed: only seeds both architectures ran
            stats = _describe(paired.to_numpy())
            if stats["n_seeds"] == 0:
                stats["note"] = "no seed in common"
            gaps[regime, f"{a} - {b}"] = stats["mean"]
            rows.append({"kind": "gap", "regime": regime, "architecture": f"{a} - {b}", **stats})
    for regime in regimes:
        ranked = {a: means[regime, a] for a in architectures if np.isfinite(means[regime, a])}
        best = max(ranked, key=ranked.get) if ranked else ""
        worst = min(ranked, key=ranked.get) if ranked else ""
        value = ranked[best] - ranked[worst] if ranked else np.nan
        label = f"{best} - {worst}" if ranked else ""
        rows.append(
            {
                "kind": "spread",
                "regime": regime,
                "architecture": label,
                "n_seeds": int(runs[runs["regime"] == regime]["seed"].nunique()),
                "mean": value,
                "note": "best minus worst architecture mean",
            }
        )
        gaps[regime, "spread"] = value
    table = pd.DataFrame(rows)
    table["regime_label"] = table["regime"].map(regime_label)
    table["reference_regime"] = reference
    table["chance"] = np.where(table["kind"] == "accuracy", chance, np.nan)
    accuracy = table["kind"] == "accuracy"
    table.loc[accuracy, "rank"] = (
        table[accuracy].groupby("regime")["mean"].rank(ascending=False, method="min")
    )
    table["delta_vs_reference"] = [
        row["mean"] - means[reference, row["architecture"]]
        if row["kind"] == "accuracy"
        else row["mean"]
        - gaps[reference, row["architecture"] if row["kind"] == "gap" else "spread"]
        for _, row in table.iterrows()
    ]
    table["rank"] = table["rank"].astype("Int64")
    return table[list(SUMMARY_COLUMNS)]


def plot_cifar(
    runs: pd.DataFrame,
    summary: pd.DataFrame,
    architectures: Sequence[str],
    regimes: Sequence[str],
    paths: Sequence[str | Path],
) -> None:
    """Left: probe accuracy by regime and architecture (mean +- std over seeds, seeds as dots,
    chance dashed). Right: the gap between architectures per regime (the interaction)."""
    fig, (ax_acc, ax_gap) = plt.subplots(
        1, 2, figsize=(11.0, 4.8), layout="constrained", width_ratios=[1.2, 1.0]
    )
    x = np.arange(len(regimes))
    width = 0.8 / max(1, len(architectures))
    acc = summary[summary["kind"] == "accuracy"].set_index(["regime", "architecture"])
    for i, arch in enumerate(architectures):
        offset = (i - (len(architectures) - 1) / 2) * width
        mean = np.array([100 * acc.loc[(r, arch), "mean"] for r in regimes])
        std = np.array([100 * acc.loc[(r, arch), "std"] for r in regimes])
        colour = ARCHITECTURE_COLOURS.get(arch, "#000000")
        ax_acc.bar(
            x + offset,
            mean,
            width,
            yerr=np.nan_to_num(std),
            capsize=3,
            color=colour,
            label=ARCHITECTURE_LABELS.get(arch, arch),
        )
        for j, regime in enumerate(regimes):
            seeds = _accuracy_by_seed(runs, regime, arch).to_numpy()
            ax_acc.plot(
                np.full(len(seeds), x[j] + offset),
                100 * seeds,
                "o",
                color="black",
                markersize=3,
                zorder=3,
            )
    if len(runs):
        ax_acc.axhline(100 * runs["chance"].iloc[0], color="grey", linestyle="--", label="chance")
    ax_acc.set_xticks(x, [regime_label(r) for r in regimes])
    ax_acc.set_xlabel("augmentation regime")
    ax_acc.set_ylabel("linear-probe test accuracy (%)")
    ax_acc.set_title("SimCLR on CIFAR-10: accuracy (mean ± s.d. over seeds)")
    ax_acc.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, fontsize=8)

    gap = summary[summary["kind"] == "gap"]
    pairs = list(dict.fromkeys(gap["architecture"]))
    gap = gap.set_index(["regime", "architecture"])
    gap_width = 0.8 / max(1, len(pairs))
    for i, pair in enumerate(pairs):
        offset = (i - (len(pairs) - 1) / 2) * gap_width
        mean = np.array([100 * gap.loc[(r, pair), "mean"] for r in regimes])
        std = np.array([100 * gap.loc[(r, pair), "std"] for r in regimes])
        a, b = pair.split(" - ")
        ax_gap.bar(
            x + offset,
            mean,
            gap_width,
            yerr=np.nan_to_num(std),
            capsize=3,
            color=PAIR_COLOURS[i % len(PAIR_COLOURS)],
            label=f"{ARCHITECTURE_LABELS.get(a, a)} − {ARCHITECTURE_LABELS.get(b, b)}",
        )
    ax_gap.axhline(0, color="black", linewidth=0.8)
    ax_gap.set_xticks(x, [regime_label(r) for r in regimes])
    ax_gap.set_xlabel("augmentation regime")
    ax_gap.set_ylabel("accuracy gap (percentage points)")
    ax_gap.set_title("gap between architectures per regime")
    ax_gap.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8)
    save_figure(fig, *paths)

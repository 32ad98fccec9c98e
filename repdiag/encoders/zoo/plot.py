"""Figure of the zoo's training curves (no torch: runs in the analysis environment)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from repdiag.common.figures import family_colour, save_figure
from repdiag.core.errors import StoreError


def read_curve(path: str | os.PathLike[str]) -> np.ndarray:
    """The losses of a ``curve.csv`` (``step,loss`` with steps 0..n-1), validated."""
    path = Path(path)
    if not path.is_file():
        raise StoreError(f"{path} does not exist: run the train_zoo rule that writes it")
    lines = path.read_text().strip().splitlines()
    if not lines or lines[0] != "step,loss":
        raise StoreError(f"{path}: expected the header 'step,loss'; delete it and rerun train_zoo")
    try:
        rows = np.array(
            [[float(v) for v in line.split(",")] for line in lines[1:]], dtype=np.float64
        )
    except ValueError as err:
        raise StoreError(f"{path}: unreadable row ({err}); delete it and rerun train_zoo") from err
    if (
        rows.shape[0] == 0
        or rows.shape[1] != 2
        or not np.array_equal(rows[:, 0], np.arange(len(rows)))
    ):
        raise StoreError(f"{path}: rows must be steps 0, 1, 2, ... with one loss each")
    if not np.all(np.isfinite(rows[:, 1])):
        raise StoreError(f"{path}: non-finite losses; the run diverged")
    return rows[:, 1]


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to ``window`` steps (shorter at the start), same length as ``values``."""
    window = max(1, min(window, len(values)))
    csum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, len(values) + 1)
    start = np.maximum(idx - window, 0)
    return (csum[idx] - csum[start]) / (idx - start)


def plot_curves(
    curves: Mapping[str, np.ndarray],
    metas: Mapping[str, Mapping[str, Any]],
    png: str | os.PathLike[str],
    pdf: str | os.PathLike[str],
) -> None:
    """One panel per run: raw loss and its moving average against the step, coloured by family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    runs = list(curves)
    cols = min(4, max(1, len(runs)))
    rows = max(1, math.ceil(len(runs) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.7 * rows + 0.6), squeeze=False)
    for ax in axes.flat[len(runs) :]:
        ax.set_visible(False)
    for ax, run in zip(axes.flat, runs, strict=False):
        meta, loss = metas[run], curves[run]
        colour = family_colour(meta.get("family", ""))
        steps = np.arange(len(loss))
        ax.plot(
            steps,
            loss,
            color=colour,
            alpha=0.3,
            linewidth=0.8,
            marker="o" if len(loss) == 1 else None,
        )
        ax.plot(steps, moving_average(loss, max(1, len(loss) // 20)), color=colour, linewidth=2)
        learning = meta.get("learning") or {}
        if "trivial_loss" in learning and math.isfinite(learning["trivial_loss"]):
            ax.axhline(learning["trivial_loss"], color="0.4", linestyle=":", linewidth=1)
        verdict = {True: "learned", False: "NOT learned"}.get(learning.get("learned"), "")
        probe = learning.get("slot_probe_accuracy")
        detail = (
            f"\n{verdict} (loss); slot probe {probe:.2f} vs {learning['slot_probe_accuracy_random_init']:.2f} at init"
            if probe is not None
            else ""
        )
        ax.set_title(
            f"{run} ({meta.get('objective', run)}, {meta.get('backbone', '?')}){detail}",
            fontsize=8,
            color="black" if learning.get("learned", True) else "#D55E00",
        )
        ax.set_xlabel("optimiser step")
        ax.set_ylabel("training loss (objective's units)")
        ax.grid(alpha=0.3)
    families = sorted({metas[r].get("family", "") for r in runs})
    handles = [Line2D([], [], color=family_colour(f), linewidth=2, label=f) for f in families]
    handles.append(Line2D([], [], color="grey", alpha=0.4, linewidth=0.8, label="per step"))
    handles.append(Line2D([], [], color="grey", linewidth=2, label="moving average"))
    handles.append(
        Line2D([], [], color="0.4", linestyle=":", linewidth=1, label="trivial solution")
    )
    fig.legend(
        handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=8, frameon=False
    )
    fig.suptitle(
        "Embedded zoo: training loss per run (title: learning check, repdiag.encoders.zoo.learning)"
    )
    fig.tight_layout(rect=(0, 0.06 + 0.04 * (len(handles) > 4), 1, 1))
    save_figure(fig, png, pdf)

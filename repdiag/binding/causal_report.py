"""The JER intervention's report: ``results/binding_causal/summary.md`` and its figure, from the
arm table and the per-seed contrasts of :mod:`repdiag.binding.causal`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding.causal import UNIT
from repdiag.common.tables import format_number, markdown_table

METRIC_NAMES = {
    "binding": "binding",
    "same_different": "Same/Different",
    "jer": "JER (top-k)",
    "pr_full": "pr (full spectrum)",
    "pr2_full": "pr2 (full spectrum)",
}


def interval_text(row: pd.Series, spec: str = ".3f") -> str:
    """``mean [low, high], p = P``: the interval over seeds with its parametric p beside it."""
    if not np.isfinite(row["mean"]):
        return "n/a"
    text = format_number(row["mean"], spec)
    if np.isfinite(row["ci_low"]) and np.isfinite(row["ci_high"]):
        text += f" [{format_number(row['ci_low'], spec)}, {format_number(row['ci_high'], spec)}]"
    p = row["p"]
    return text + (f", p = {p:.2g}" if np.isfinite(p) else ", p = n/a")


def contrast_table(contrasts: pd.DataFrame, role: str, reference: str | None) -> pd.DataFrame:
    """The rows of one role (and reference), one line per base, metric and arm."""
    part = contrasts[contrasts["role"] == role]
    if reference is not None:
        part = part[part["reference"] == reference]
    spec = {"effect": ".3f", "manipulation": ".2f"}[role]
    return pd.DataFrame(
        [
            {
                "base": row["base"],
                "metric": METRIC_NAMES.get(row["metric"], row["metric"]),
                "contrast": f"{row['arm']} − {row['reference']}",
                "unit": row["unit"],
                "n": int(row["n"]),
                f"mean over seeds [{row['confidence']:.0%} t-interval], p": interval_text(
                    row, spec
                ),
                "left out (seeds)": row["seeds_left_out"] or "–",
            }
            for _, row in part.iterrows()
        ]
    )


def runs_table(arms: pd.DataFrame) -> pd.DataFrame:
    """One line per training run: its loss screen and its measurements (query-level intervals:
    measurement precision of that network only)."""
    return pd.DataFrame(
        [
            {
                "base": row["base"],
                "arm": row["arm"],
                "seed": int(row["seed"]),
                "model": row["model"],
                "final loss (z vs plain)": f"{row['final_loss']:.3f} ({format_number(row['loss_z'], '+.1f')})",
                "in effect": "no" if row["left_out"] else "yes",
                "binding [Wilson, query-level]": _wilson(row),
                "Same/Different": format_number(row["same_different"]),
                "JER top-k": format_number(row["jer"], ".2f"),
                "pr full": format_number(row.get("pr_full", math.nan), ".2f"),
                "pr2 full": format_number(row.get("pr2_full", math.nan), ".2f"),
                "steps up/down": f"{int(row.get('steps_up', 0))}/{int(row.get('steps_down', 0))}",
            }
            for _, row in arms.iterrows()
        ]
    )


def _wilson(row: pd.Series) -> str:
    text = format_number(row["binding"])
    if np.isfinite(row["binding_ci_low"]) and np.isfinite(row["binding_ci_high"]):
        text += f" [{row['binding_ci_low']:.2f}, {row['binding_ci_high']:.2f}]"
    return text


def calibration_lines(calibration: pd.DataFrame | None) -> list[str]:
    if calibration is None or calibration.empty:
        return []
    rows = [
        {
            "run (plain trajectory)": row["run"],
            "|w|": format_number(row["weight"], "g"),
            "steps measured": int(row["n_steps"]),
            "ratio median [min, max]": f"{row['ratio_median']:.3f} [{row['ratio_min']:.3f}, "
            f"{row['ratio_max']:.3f}]",
            "share in 0.1-0.3": format_number(row["share_in_range"], ".2f"),
            f"|w| for ratio {row['target']:g}": format_number(row["weight_for_target"], ".3g"),
        }
        for _, row in calibration.iterrows()
    ]
    return [
        "## Calibration pilot",
        "",
        "Backbone gradient norm of the JER term at |w| against the objective's, along each "
        "base's plain trajectory (repdiag.encoders.zoo.calibrate); the design asks for 0.1-0.3.",
        "",
        markdown_table(pd.DataFrame(rows)),
        "",
    ]


def causal_markdown(
    arms: pd.DataFrame,
    contrasts: pd.DataFrame,
    calibration: pd.DataFrame | None,
    *,
    spread_sd: float,
    readout: str,
) -> str:
    """``results/binding_causal/summary.md``: design, calibration, the runs and their loss
    screen, the primary estimate (against the sham), against plain, the manipulation check."""
    lines = [
        "# JER intervention (binding_causal)",
        "",
        "Per base and seed, four runs that differ only in the JER term L = L_objective − w_t · "
        "PR2_hat: plain (w_t = 0), raise (+w), lower (−w), sham (±w at random each step). "
        f"Unit: {UNIT}; n = seeds. Binding: the {readout} readout at the final tap. Intervals "
        "are Student-t over seeds with the parametric two-sided p beside them; the query-level "
        "Wilson intervals in the runs table are measurement precision only. A run whose final "
        f"objective loss lies more than {spread_sd:g} SD from the plain runs' mean is left out.",
        "",
    ]
    if arms.empty:
        return "\n".join([*lines, "No causal bases in this config (binding_causal.series).", ""])
    left = arms[arms["left_out"]]
    lines += calibration_lines(calibration)
    lines += [
        "## Runs",
        "",
        markdown_table(runs_table(arms)),
        "",
        f"Left out by the loss screen: {', '.join(left['model']) if len(left) else 'none'}.",
        "",
    ]
    sections = (
        ("## Primary estimate: each arm against the sham", "effect", "sham"),
        ("## Effects against plain", "effect", "plain"),
        ("## Manipulation check (top-k JER, full-spectrum pr and pr2)", "manipulation", None),
    )
    for title, role, reference in sections:
        table = contrast_table(contrasts, role, reference) if not contrasts.empty else None
        if table is not None and not table.empty:
            lines += [title, "", markdown_table(table), ""]
    return "\n".join(lines)


def causal_figure(arms: pd.DataFrame, contrasts: pd.DataFrame, *, chance: float | None) -> Any:
    """Three panels: binding per arm (one line per seed, per base), the primary estimate
    (binding and Same/Different minus the sham's, t-interval over seeds) and the manipulation
    check (JER top-k, full-spectrum pr and pr2 minus plain's)."""
    import matplotlib.pyplot as plt

    from repdiag.common.figures import cycle_colour

    fig, axes = plt.subplots(1, 3, figsize=(14.0, 4.2), layout="constrained")
    if arms.empty:
        for ax in axes:
            ax.text(0.5, 0.5, "no causal bases in this config", ha="center", transform=ax.transAxes)
        return fig
    order = [a for a in ("plain", "raise", "lower", "sham") if a in set(arms["arm"])]
    for i, (base, part) in enumerate(arms.groupby("base", sort=False)):
        for seed, runs in part.groupby("seed"):
            runs = runs.set_index("arm").reindex(order)
            axes[0].plot(
                order,
                runs["binding"],
                "o-",
                color=cycle_colour(i),
                alpha=0.6,
                label=base if seed == part["seed"].min() else None,
            )
    if chance is not None and np.isfinite(chance):
        axes[0].axhline(chance, color="black", linestyle=":", linewidth=1, label="chance")
    axes[0].set(ylabel="binding accuracy", title="binding per arm (lines: seeds)")
    axes[0].legend(fontsize=7)
    panels = (
        (axes[1], "effect", "sham", "effect against the sham"),
        (axes[2], "manipulation", "plain", "manipulation check against plain"),
    )
    for ax, role, reference, title in panels:
        part = contrasts[(contrasts["role"] == role) & (contrasts["reference"] == reference)]
        labels = [f"{r.base}\n{METRIC_NAMES[r.metric]}\n{r.arm}" for r in part.itertuples()]
        y = part["mean"].to_numpy(float)
        err = np.abs(
            np.vstack([y - part["ci_low"].to_numpy(float), part["ci_high"].to_numpy(float) - y])
        )
        ax.errorbar(np.arange(len(y)), y, yerr=np.nan_to_num(err), fmt="o", capsize=2)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(np.arange(len(y)), labels, fontsize=5, rotation=90)
        ax.set(title=title, ylabel="arm − reference (mean over seeds, t-interval)")
    fig.suptitle("JER intervention: L = L_objective − w_t × PR2 estimate (unit: training run)")
    return fig

"""The JER intervention's report: ``results/binding_causal/summary.md`` and its figure, from the
tables of :mod:`repdiag.binding.causal.analysis`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding.analysis.columns import metric_label
from repdiag.binding.causal.analysis import ACTIVE_ARMS, MATCH_TOLERANCE, UNIT
from repdiag.common.tables import format_number, markdown_table

ARM_ORDER = ("plain", "null", "raise", "lower", "sham", "geometry")
METRIC_NAMES = {
    "binding": "binding",
    "same_different": "Same/Different",
    "jer": "JER (top-k)",
    "pr_full": "pr (full spectrum)",
    "pr2_full": "pr2 (full spectrum)",
    "g_pr": "G.PR",
    "g_iso": "G.Iso",
    "presence_loss": "presence loss (held out)",
}
ALPHA = 0.05


def metric_name(metric: str) -> str:
    return METRIC_NAMES.get(metric) or metric_label(metric)


def interval_text(row: pd.Series, spec: str = ".3f") -> str:
    """``mean [low, high]``: the mean over seeds with its t-interval."""
    if not np.isfinite(row["mean"]):
        return "n/a"
    text = format_number(row["mean"], spec)
    if np.isfinite(row["ci_low"]) and np.isfinite(row["ci_high"]):
        text += f" [{format_number(row['ci_low'], spec)}, {format_number(row['ci_high'], spec)}]"
    return text


def _p(value: float) -> str:
    return f"{value:.2g}" if np.isfinite(value) else "n/a"


def family_table(contrasts: pd.DataFrame, family: str) -> pd.DataFrame:
    """The rows of one family: contrast, metric, n, the interval, t p, exact p, Holm p and the
    verdict at the family's level."""
    part = contrasts[contrasts["family"] == family]
    holm = family in ("primary", "secondary")
    rows = []
    for _, row in part.iterrows():
        record = {
            "contrast": f"{row['arm']} − {row['reference']}",
            "metric": metric_name(row["metric"]),
            "n (seeds)": int(row["n"]),
            f"mean [{row['confidence']:.0%} t-interval]": interval_text(row),
            "p (t)": _p(row["p_t"]),
            "p (exact sign-flip)": _p(row["p_exact"]),
        }
        if holm:
            record[f"p (Holm, {int(row['family_size'])} tests)"] = _p(row["p_holm"])
            record[f"at {ALPHA:g} (Holm)"] = "differs" if row["p_holm"] <= ALPHA else "cannot tell"
        rows.append(record)
    return pd.DataFrame(rows)


def manipulation_matrix(contrasts: pd.DataFrame) -> pd.DataFrame:
    """Arms as rows, metrics as columns: each arm minus plain, mean [t-interval] over seeds."""
    part = contrasts[contrasts["family"] == "manipulation"]
    metrics = list(dict.fromkeys(part["metric"]))
    rows = []
    for arm in [a for a in ARM_ORDER if a in set(part["arm"])]:
        cells = part[part["arm"] == arm].set_index("metric")
        rows.append(
            {
                "arm − plain": arm,
                **{
                    metric_name(m): interval_text(cells.loc[m], ".3g") if m in cells.index else ""
                    for m in metrics
                },
            }
        )
    return pd.DataFrame(rows)


def runs_table(arms: pd.DataFrame) -> pd.DataFrame:
    """One line per training run (query-level Wilson intervals: measurement precision of that
    network only)."""
    order = {arm: k for k, arm in enumerate(ARM_ORDER)}
    arms = arms.assign(_order=arms["arm"].map(order)).sort_values(["base", "_order", "seed"])
    return pd.DataFrame(
        [
            {
                "arm": row["arm"],
                "seed": int(row["seed"]),
                "weight": format_number(row.get("weight", math.nan), ".3g"),
                "binding [Wilson, query-level]": _wilson(row),
                "Same/Different": format_number(row["same_different"]),
                "JER top-k": format_number(row["jer"], ".2f"),
                "pr2 full": format_number(row.get("pr2_full", math.nan), ".2f"),
                "G.PR": format_number(row.get("g_pr", math.nan), ".3f"),
                "presence loss": format_number(row.get("presence_loss", math.nan), ".4f"),
                "‖Δθ‖/‖θ‖": format_number(row.get("distance", math.nan), ".3f"),
                "Δθ along push": format_number(row.get("along_push", math.nan), ".3g"),
                "share of step": format_number(row.get("update_share", math.nan), ".3f"),
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
            "term": row["term"],
            "steps measured": int(row["n_steps"]),
            "share of the step per unit weight, median [p10, p90]": (
                f"{row['share_per_unit_weight_median']:.4g} "
                f"[{row['share_per_unit_weight_p10']:.4g}, {row['share_per_unit_weight_p90']:.4g}]"
            ),
            f"weight for share {row['target']:g}": format_number(row["weight_for_target"], ".3g"),
        }
        for _, row in calibration.iterrows()
    ]
    return [
        "## Calibration pilot",
        "",
        "The push's part of the AdamW step against the objective's own step, per unit weight, "
        "along each base's plain trajectory (repdiag.encoders.zoo.calibrate).",
        "",
        markdown_table(pd.DataFrame(rows)),
        "",
    ]


def displacement_lines(summary: pd.DataFrame) -> list[str]:
    if summary.empty:
        return []
    rows = []
    for _, row in summary.iterrows():
        matched = row["matched"]
        rows.append(
            {
                "arm": row["arm"],
                "n": int(row["n"]),
                "‖θ − θ_plain‖/‖θ_plain‖ [t-interval]": _mean_ci(row, "distance", ".3f"),
                "× null": format_number(row["distance_vs_null"], ".2f"),
                "along own push [t-interval]": _mean_ci(row, "along_push", ".3g"),
                "× raise": format_number(row["along_push_vs_raise"], ".2f"),
                f"matched (±{MATCH_TOLERANCE:.0%})": "–"
                if matched is None or (isinstance(matched, float) and math.isnan(matched))
                else ("yes" if bool(matched) else "no"),
                "realised share of step": _mean_ci(row, "update_share", ".3f"),
            }
        )
    return [
        "## Displacement from plain (backbone weights)",
        "",
        "How far each arm ended from the plain run of its seed, and how far along its own "
        "cumulative push P (the push's preconditioned part of every AdamW step, summed). The "
        "null arm's distance is the floor: chaos alone.",
        "",
        markdown_table(pd.DataFrame(rows)),
        "",
    ]


def _mean_ci(row: pd.Series, column: str, spec: str) -> str:
    mean, low, high = row[column], row[f"{column}_ci_low"], row[f"{column}_ci_high"]
    if not np.isfinite(mean):
        return "n/a"
    text = format_number(mean, spec)
    if np.isfinite(low) and np.isfinite(high):
        text += f" [{format_number(low, spec)}, {format_number(high, spec)}]"
    return text


def observational_lines(per_jer: pd.DataFrame, associations: pd.DataFrame) -> list[str]:
    lines = ["## Interventional against observational", ""]
    for _, row in per_jer.iterrows():
        lines.append(
            f"- {row['base']}: the {row['arm']} arm moved binding by "
            f"{format_number(row['binding_change'], '+.3f')} and top-k JER by "
            f"{format_number(row['jer_change'], '+.2f')}: "
            f"{format_number(row['binding_per_jer'], '.3f')} binding per unit of JER "
            f"[{format_number(row['ci_low'], '.3f')}, {format_number(row['ci_high'], '.3f')}] "
            f"({row['confidence']:.0%} percentile interval over {int(row['n_boot'])} seed "
            f"resamples, n = {int(row['n'])})."
        )
    for _, row in associations.iterrows():
        lines.append(
            f"- {row['base']}, plain runs (n = {int(row['n'])}): r(binding, "
            f"{metric_name(row['metric'])}) = {format_number(row['pearson_r'], '.2f')} "
            f"[{format_number(row['ci_low'], '.2f')}, {format_number(row['ci_high'], '.2f')}], "
            f"p = {_p(row['p'])} (t), {_p(row.get('p_exact', math.nan))} (permutation)"
            + (f" ({row['note']})" if isinstance(row.get("note"), str) and row["note"] else "")
        )
    return [*lines, ""]


def causal_markdown(
    arms: pd.DataFrame,
    contrasts: pd.DataFrame,
    calibration: pd.DataFrame | None,
    displacement: pd.DataFrame,
    per_jer: pd.DataFrame,
    associations: pd.DataFrame,
    *,
    readout: str,
) -> str:
    """``results/binding_causal/summary.md``: design, calibration, the families with their
    Holm levels, the floor, displacement, the manipulation matrix, the observational contrast
    and every run."""
    lines = [
        "# JER intervention (binding_causal)",
        "",
        "Per base and seed, runs that differ only in a push added to the objective's gradient "
        "on the backbone: plain (none), raise / lower (the final tap's PR2 estimate up / down), "
        "sham (a fixed seeded direction orthogonal to both gradients, as large as raise's push), "
        "geometry (the batch's G.PR up) and null (a negligible push: the chaos floor). "
        f"Unit: {UNIT}; n = seeds. Binding: the {readout} readout at the final tap. By "
        "intention to treat every run is kept. Intervals are Student-t over seeds, with the t p "
        "and the exact sign-flip p beside them; each family's verdict is at Holm's level over "
        "its exact p; the query-level Wilson intervals in the runs table are measurement "
        "precision only.",
        "",
    ]
    if arms.empty:
        return "\n".join([*lines, "No causal bases in this config (binding_causal.series).", ""])
    lines += calibration_lines(calibration)
    sections = (
        (
            f"## Primary family: {', '.join(ACTIVE_ARMS)} against plain (pre-registered)",
            "primary",
        ),
        ("## Secondary family: does the push's aim matter at matched size?", "secondary"),
        ("## The floor: null against plain (in no family)", "floor"),
    )
    for title, family in sections:
        if not contrasts.empty and (contrasts["family"] == family).any():
            lines += [title, "", markdown_table(family_table(contrasts, family)), ""]
    lines += displacement_lines(displacement)
    if not contrasts.empty and (contrasts["family"] == "manipulation").any():
        lines += [
            "## Manipulation matrix (each arm − plain, mean over seeds [t-interval])",
            "",
            markdown_table(manipulation_matrix(contrasts)),
            "",
        ]
    lines += observational_lines(per_jer, associations)
    lines += ["## Runs", "", markdown_table(runs_table(arms)), ""]
    return "\n".join(lines)


def causal_figure(
    arms: pd.DataFrame,
    contrasts: pd.DataFrame,
    *,
    chance: float | None,
    label: str = "binding accuracy",
) -> Any:
    """Three panels: binding per arm (one line per seed), each arm's effect on binding and
    Same/Different against plain (t-interval over seeds; the null arm's beside them), and the
    manipulation on top-k JER and G.PR (standardised by the plain runs' SD)."""
    import matplotlib.pyplot as plt

    from repdiag.common.figures import cycle_colour

    fig, axes = plt.subplots(1, 3, figsize=(14.0, 4.4), layout="constrained")
    if arms.empty:
        for ax in axes:
            ax.text(0.5, 0.5, "no causal bases in this config", ha="center", transform=ax.transAxes)
        return fig
    order = [a for a in ARM_ORDER if a in set(arms["arm"])]
    for _, runs in arms.groupby("seed"):
        runs = runs.drop_duplicates("arm").set_index("arm").reindex(order)
        axes[0].plot(order, runs["binding"], "o-", color="0.4", alpha=0.35, markersize=3)
    means = arms.groupby("arm")["binding"].mean().reindex(order)
    axes[0].plot(order, means, "s-", color=cycle_colour(0), label="mean over seeds")
    if chance is not None and np.isfinite(chance):
        axes[0].axhline(chance, color="black", linestyle=":", linewidth=1, label="chance")
    axes[0].set(ylabel=label, title="binding per arm (grey lines: seeds)")
    axes[0].legend(fontsize=7)
    effects = contrasts[contrasts["family"].isin(["primary", "floor"])]
    for k, metric in enumerate(("binding", "same_different")):
        part = effects[effects["metric"] == metric]
        x = np.arange(len(part)) + (k - 0.5) * 0.25
        y = part["mean"].to_numpy(float)
        err = np.abs(np.vstack([y - part["ci_low"].to_numpy(float), part["ci_high"] - y]))
        axes[1].errorbar(
            x, y, yerr=np.nan_to_num(err), fmt="o", capsize=2, color=cycle_colour(k),
            label=metric_name(metric),
        )  # fmt: skip
        axes[1].set_xticks(np.arange(len(part)), list(part["arm"]))
    axes[1].axhline(0, color="black", linewidth=0.8)
    axes[1].set(title="effect against plain (t-interval over seeds)", ylabel="arm − plain")
    axes[1].legend(fontsize=7)
    moved = contrasts[
        (contrasts["family"] == "manipulation") & contrasts["metric"].isin(["jer", "g_pr"])
    ]
    plain = arms[arms["arm"] == "plain"]
    for k, metric in enumerate(("jer", "g_pr")):
        part = moved[moved["metric"] == metric]
        scale = float(plain[metric].std(ddof=1)) if len(plain) > 1 else 1.0
        scale = scale if np.isfinite(scale) and scale > 0 else 1.0
        x = np.arange(len(part)) + (k - 0.5) * 0.25
        y = part["mean"].to_numpy(float) / scale
        err = np.abs(
            np.vstack([y - part["ci_low"].to_numpy(float) / scale, part["ci_high"] / scale - y])
        )
        axes[2].errorbar(
            x, y, yerr=np.nan_to_num(err), fmt="o", capsize=2, color=cycle_colour(k + 2),
            label=metric_name(metric),
        )  # fmt: skip
        axes[2].set_xticks(np.arange(len(part)), list(part["arm"]))
    axes[2].axhline(0, color="black", linewidth=0.8)
    axes[2].set(
        title="manipulation against plain",
        ylabel="arm − plain, in SDs of the plain runs",
    )
    axes[2].legend(fontsize=7)
    fig.suptitle(f"JER intervention: pushes during training (unit: {UNIT})")
    return fig

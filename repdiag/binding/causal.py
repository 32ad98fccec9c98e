"""The JER intervention (``binding_causal``): manipulate the Jacobian effective rank, measure binding.

Each regularised zoo run is trained like its unregularised run except for a term on its final
tap's JER, ``L = L_objective - w * mean PR2_hat`` (``zoo.objectives.<run>.jer_regulariser``,
repdiag.encoders.jer_estimator); ``binding_causal.comparisons`` pairs each regularised model with
the model of that unregularised run. Two questions, per pair:

- manipulation check: did the JER the workflow's own engine measures (not the training
  estimate) move in the direction of ``w``? ``jer_delta`` is the mean over the shared probe images
  of ``JER_reg(x) - JER_base(x)`` at the final layer, with its paired t-interval;
- effect: how much did binding and Same/Different move? Differences of two accuracies on the same
  queries, with Newcombe's hybrid score interval (repdiag.common.intervals), which treats the two
  as independent and so is wider than a paired interval would be.

Across the runs of one objective (its baselines and every regularised run), binding is also
correlated with the engine's JER, bootstrapped over those models (repdiag.common.statistics).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding.analysis.depth import read_jacobians, select_images
from repdiag.binding.stats_options import StatsSettings
from repdiag.common import statistics as stats
from repdiag.common.intervals import mean_interval, newcombe_interval
from repdiag.common.tables import format_number, markdown_table
from repdiag.core.errors import StoreError
from repdiag.core.store import read_json


def final_jer_by_image(
    path: str | Path, formula: str, final_layer: str, probe_set: str
) -> pd.Series:
    """Per-image ``jer_<formula>`` at ``final_layer`` of one Jacobian store, indexed by image."""

    ds = read_jacobians(path, formula)
    layers = [str(name) for name in ds["layer"].values]
    if final_layer not in layers:
        raise StoreError(
            f"store {path}: no layer {final_layer!r} (has {layers}); rerun jacobian_spectra"
        )
    mask = select_images(ds, probe_set, path)
    values = np.asarray(ds[f"jer_{formula}"].sel(layer=final_layer).values, dtype=float)
    images = np.asarray(ds["image"].values) if "image" in ds.coords else np.arange(len(values))
    return pd.Series(values[mask], index=images[mask])


def paired_delta(
    treated: pd.Series, base: pd.Series, confidence: float
) -> tuple[float, float, float, int]:
    """Mean over the shared images of treated - base, its paired t-interval and the image count."""
    shared = treated.index.intersection(base.index)
    if len(shared) < 2:
        raise StoreError(
            f"the two Jacobian stores share {len(shared)} probe images; extract both models "
            "with the same jacobians.probes"
        )
    mean, _, low, high = mean_interval((treated[shared] - base[shared]).to_numpy(), confidence)
    return mean, low, high, len(shared)


def _accuracy_delta(
    row: pd.Series, base: pd.Series, column: str, size: str, confidence: float
) -> dict[str, float]:
    n, n_base = row.get(size, math.nan), base.get(size, math.nan)
    p, p_base = float(row[column]), float(base[column])
    low = high = math.nan
    if all(np.isfinite([n, n_base, p, p_base])) and n > 0 and n_base > 0:
        low, high = newcombe_interval(p * n, int(n), p_base * n_base, int(n_base), confidence)
    return {
        f"{column}_baseline": p_base,
        column: p,
        f"{column}_delta": p - p_base,
        f"{column}_delta_ci_low": low,
        f"{column}_delta_ci_high": high,
    }


def regulariser_of(meta_path: str | Path) -> dict[str, float]:
    """The weight and the training estimates a regularised run's ``meta.json`` records."""
    meta = read_json(meta_path)
    record = meta.get("jer_regulariser") or {}
    if "weight" not in record:
        raise StoreError(f"{meta_path}: no jer_regulariser record; rerun train_zoo for this run")
    return {
        "weight": float(record["weight"]),
        "estimate_first": float(record.get("estimate_first", math.nan)),
        "estimate_last_mean": float(record.get("estimate_last_mean", math.nan)),
    }


def causal_effects(
    table: pd.DataFrame,
    jer_by_model: Mapping[str, pd.Series],
    pairs: Mapping[str, str],
    regularisers: Mapping[str, Mapping[str, float]],
    settings: StatsSettings,
) -> pd.DataFrame:
    """``effects.csv``: one row per regularised model against its baseline (module docstring).

    ``table`` is the aggregate of the regularised models and their baselines
    (:func:`repdiag.binding.analysis.aggregate.aggregate`), ``jer_by_model`` each model's per-image
    final-layer JER (:func:`final_jer_by_image`).
    """
    rows_by_model = table.set_index("model")
    binding = settings.binding_column
    rows = []
    for model, baseline in pairs.items():
        row, base = rows_by_model.loc[model], rows_by_model.loc[baseline]
        weight = float(regularisers[model]["weight"])
        delta, low, high, n_images = paired_delta(
            jer_by_model[model], jer_by_model[baseline], settings.confidence
        )
        intended = math.copysign(1.0, weight)
        record = {
            "model": model,
            "baseline": baseline,
            "objective": str(base["family"]),
            "weight": weight,
            "seed": float(row.get("seed", math.nan)),
            "formula": settings.jer_formula,
            "jer_baseline": float(jer_by_model[baseline].mean()),
            "jer": float(jer_by_model[model].mean()),
            "jer_delta": delta,
            "jer_delta_ci_low": low,
            "jer_delta_ci_high": high,
            "n_images": n_images,
            # the manipulation held: the whole interval lies on the side the weight pushed
            "manipulated": bool(intended * low > 0 and intended * high > 0),
            "estimate_first": regularisers[model]["estimate_first"],
            "estimate_last_mean": regularisers[model]["estimate_last_mean"],
        }
        record |= _accuracy_delta(row, base, binding, "n_queries", settings.confidence)
        record |= _accuracy_delta(row, base, "same_different", "n_pairs", settings.confidence)
        record["binding_changed"] = bool(
            record[f"{binding}_delta_ci_low"] > 0 or record[f"{binding}_delta_ci_high"] < 0
        )
        rows.append(record)
    frame = pd.DataFrame(rows)
    frame["confidence"] = settings.confidence
    return frame.sort_values(["objective", "weight", "seed"], kind="stable").reset_index(drop=True)


def causal_correlations(
    table: pd.DataFrame, pairs: Mapping[str, str], settings: StatsSettings
) -> pd.DataFrame:
    """Per objective, r(JER, binding) and r(JER, Same/Different) over its baselines and every
    regularised run of it: the JER varies there because it was manipulated."""
    family_of_baseline = table.set_index("model")["family"].to_dict()
    groups: dict[str, list[str]] = {}
    for model, baseline in pairs.items():
        members = groups.setdefault(str(family_of_baseline[baseline]), [])
        members += [m for m in (baseline, model) if m not in members]
    frames = []
    options = {
        "n_boot": settings.n_bootstrap,
        "seed": settings.seed,
        "confidence": settings.confidence,
        "min_models": 3,
    }
    for objective, members in sorted(groups.items()):
        part = table[table["model"].isin(members)]
        for target in ("binding", "same_different"):
            frame = stats.correlation_table(part, target, ["jer"], **options)
            frame.insert(0, "objective", objective)
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def with_interval(value: float, low: float, high: float, spec: str = ".3f") -> str:
    text = format_number(value, spec)
    if np.isfinite(low) and np.isfinite(high):
        text += f" [{format_number(low, spec)}, {format_number(high, spec)}]"
    return text


def causal_markdown(
    effects: pd.DataFrame, correlations: pd.DataFrame, settings: StatsSettings
) -> str:
    """``results/binding_causal/summary.md``: what was manipulated, the manipulation check, the
    effect on binding and Same/Different, and the within-objective correlations."""
    binding = settings.binding_column
    level = f"{settings.confidence:.0%}"
    lines = [
        "# JER intervention (binding_causal)",
        "",
        "Each regularised run is its baseline run plus a term on the final tap's Jacobian "
        "effective rank, L = L_objective - w * mean PR2_hat (w > 0 raises it, w < 0 lowers it); "
        "nothing else differs. JER is measured afterwards by the workflow's engine "
        f"(`jer_{settings.jer_formula}` at the final layer, paired over the probe images); "
        "binding and Same/Different differences use Newcombe's interval (unpaired, so "
        f"conservative). Intervals are {level}.",
        "",
    ]
    if effects.empty:
        return "\n".join(
            [*lines, "No comparisons in this config (binding_causal.comparisons).", ""]
        )
    held = int(effects["manipulated"].sum())
    changed = int(effects["binding_changed"].sum())
    lines += [
        f"Manipulation check: the engine's JER moved in the direction of w, with its interval "
        f"excluding 0, in {held} of {len(effects)} runs. Binding ({binding}) changed with its "
        f"interval excluding 0 in {changed} of {len(effects)}.",
        "",
    ]
    rows = [
        {
            "model": row["model"],
            "baseline": row["baseline"],
            "w": format_number(row["weight"], "g"),
            "JER base": format_number(row["jer_baseline"], ".2f"),
            f"Δ JER ({level} CI)": with_interval(
                row["jer_delta"], row["jer_delta_ci_low"], row["jer_delta_ci_high"], ".2f"
            ),
            "training estimate (last)": format_number(row["estimate_last_mean"], ".1f"),
            "binding base": format_number(row[f"{binding}_baseline"]),
            f"Δ binding ({level} CI)": with_interval(
                row[f"{binding}_delta"],
                row[f"{binding}_delta_ci_low"],
                row[f"{binding}_delta_ci_high"],
            ),
            f"Δ Same/Different ({level} CI)": with_interval(
                row["same_different_delta"],
                row["same_different_delta_ci_low"],
                row["same_different_delta_ci_high"],
            ),
        }
        for _, row in effects.iterrows()
    ]
    lines += [markdown_table(pd.DataFrame(rows)), ""]
    if not correlations.empty:
        corr = [
            {
                "objective": row["objective"],
                "target": row["target"],
                "n models": int(row["n"]),
                f"Pearson r with JER ({level} CI)": with_interval(
                    row["pearson_r"], row["pearson_ci_low"], row["pearson_ci_high"], ".2f"
                ),
                "Spearman rho": format_number(row["spearman_rho"], ".2f"),
                "note": row["note"] if isinstance(row["note"], str) else "",
            }
            for _, row in correlations.iterrows()
        ]
        lines += [
            "Across each objective's baselines and regularised runs (JER varied by the "
            "intervention):",
            "",
            markdown_table(pd.DataFrame(corr)),
            "",
        ]
    return "\n".join(lines)


def causal_figure(
    effects: pd.DataFrame,
    models: pd.DataFrame,
    pairs: Mapping[str, str],
    *,
    binding_column: str = "binding",
    chance: float | None = None,
) -> Any:
    """Three panels: the manipulation check (engine JER change against w, per seed with its
    interval), binding change against w, and binding against the engine's JER over each
    objective's baselines and regularised runs."""
    import matplotlib.pyplot as plt

    from repdiag.common.figures import cycle_colour, interval_yerr

    fig, axes = plt.subplots(1, 3, figsize=(13.0, 4.0), layout="constrained")
    check_ax, effect_ax, scatter_ax = axes
    if effects.empty:
        for ax in axes:
            ax.text(0.5, 0.5, "no comparisons in this config", ha="center", transform=ax.transAxes)
        return fig
    panels = (
        (check_ax, "jer", "change in JER (engine, final layer)"),
        (effect_ax, binding_column, "change in binding accuracy"),
    )
    groups = list(effects.groupby("objective", sort=True))
    span = float(effects["weight"].abs().max()) or 1.0
    for i, (objective, rows) in enumerate(groups):
        colour = cycle_colour(i)
        label = f"{objective} ({', '.join(sorted(set(rows['baseline'])))})"
        # a small offset per objective so that the two groups' bars do not overlap
        x = rows["weight"].to_numpy(float) + (i - (len(groups) - 1) / 2) * 0.04 * span
        for ax, column, _ in panels:
            delta = rows[f"{column}_delta"]
            yerr = interval_yerr(
                delta, rows[f"{column}_delta_ci_low"], rows[f"{column}_delta_ci_high"]
            )
            ax.errorbar(x, delta, yerr=yerr, fmt="o", capsize=2, color=colour, label=label)
        part = models[models["model"].isin({*rows["model"], *rows["baseline"]})]
        low = part.get(f"{binding_column}_ci_low", part["binding"])
        high = part.get(f"{binding_column}_ci_high", part["binding"])
        scatter_ax.errorbar(
            part["jer"],
            part["binding"],
            yerr=interval_yerr(part["binding"], low, high),
            fmt="o",
            capsize=2,
            color=colour,
            label=label,
        )
    for ax, _, ylabel in panels:
        ax.axhline(0, color="black", linewidth=0.8)
        ax.axvline(0, color="grey", linewidth=0.6, linestyle=":")
        ax.set(xlabel="regulariser weight w (> 0 raises JER)", ylabel=ylabel)
        ax.set_xlim(-1.25 * span, 1.25 * span)
        ax.legend(fontsize=7)
    check_ax.set_title("manipulation check")
    effect_ax.set_title("effect on binding")
    if chance is not None and np.isfinite(chance):
        scatter_ax.axhline(chance, color="black", linestyle=":", linewidth=1, label="chance")
    scatter_ax.set(
        xlabel="JER (effective rank, directions)",
        ylabel="binding accuracy",
        title="baselines and regularised runs (final layer)",
    )
    scatter_ax.legend(fontsize=7)
    fig.suptitle("JER intervention: L = L_objective - w x JER estimate")
    return fig

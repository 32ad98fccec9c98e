"""The binding dose series: binding manipulated by a declared factor, and what follows it.

A presence-supervised backbone is also told the slot labels through a second head weighted by
the dose lambda (``zoo.hparams.supervised.slot_weight``; ``L = L_presence + lambda * L_slots``;
the grid ``series.dose`` of config/config.yaml). The dose is set before training, so binding varies
across the series for a named reason, unlike across the objective families.

The analysis, fixed before the run (docs/binding.md, "Dose series: the analysis, written before
the run"); the unit is the training run, its final network one row, the seed a block
(:mod:`repdiag.common.units`, :mod:`repdiag.common.replication`):

1. Per seed, the least-squares slope of each metric on binding over that seed's doses (top-k
   JER, full-spectrum pr and pr2 where the store kept ``singular_values_full``, G.PR, G.Iso,
   every L.Iso k, Same/Different); the mean over seeds with its Student-t interval and the
   one-sample t p (n = seeds), and beside it the exact sign-flip p of the per-seed slopes
   (``p_exact``, :func:`repdiag.common.exact.exact_p`, up to 10 seeds). The same slope
   standardised, x sd(binding) / sd(metric) within seeds (deviations from each seed's mean, so a
   seed offset does not shrink it). Beside it: Pearson r over the runs with a bootstrap
   interval over runs and the seed-blocked permutation p, and as a check the seed fixed-effects
   OLS ``metric ~ binding + C(seed)`` with its t p on n - seeds - 1 degrees of freedom
   (``fe_*``; it replaced a mixed model whose Wald z p ignored how few seeds there are).
2. The paper's question, does JER track binding more than global geometry does: per seed,
   |standardised slope of JER| - |standardised slope of G| for each geometry metric G, with its
   t-interval over seeds, its t p and its exact sign-flip p.
3. Checkpoints (``stop_at``) are not units: they are shown as trajectories of their run, its
   step 0 being the untrained network of the same seed (the control ``random_resnet``), counted
   once. An analysis handed two rows of one run is refused (``require_independent``), and so
   is a series row without a seed (it would be keyed ``seed=n/a`` and its run merged with
   another's).

The summary's section on the series is written by :mod:`repdiag.binding.dose_report`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding.analysis.columns import l_iso_columns
from repdiag.common import replication as rep
from repdiag.common import statistics as stats
from repdiag.common.exact import exact_correlation_p, exact_p
from repdiag.common.tables import format_number
from repdiag.common.units import Units, check_units

SERIES = "dose series"
UNIT = "training run (final network)"
SENSITIVITY = ("jer", "pr_full", "pr2_full")
N_PERMUTATIONS = 20000


def series_metrics(table: pd.DataFrame) -> list[str]:
    """The metrics set against binding within the series: top-k JER, the full-spectrum pr and
    pr2, the geometry metrics the paper says do not track binding (G.PR, G.Iso, every L.Iso k),
    and Same/Different; those the table has with a finite value."""
    columns = [*SENSITIVITY, "g_pr", "g_iso", *l_iso_columns(table), "same_different"]
    return [c for c in columns if c in table.columns and np.isfinite(table[c].astype(float)).any()]


def geometry_metrics(metrics: list[str]) -> list[str]:
    return [m for m in metrics if m in ("g_pr", "g_iso") or m.startswith("l_iso")]


def dose_series(table: pd.DataFrame) -> pd.DataFrame:
    """Every model of the series (a finite ``dose``: presence runs at lambda = 0 and every
    ``binding_dose`` run, checkpoints included), ordered by dose, seed and step, with ``run``:
    the training run it belongs to (``lambda=<dose>/seed=<seed>``). Fewer than two doses are
    no series: nothing was manipulated (e.g. the supervised runs alone, at lambda = 0)."""
    if "dose" not in table:
        return table.iloc[0:0].assign(run=[])
    series = table[np.isfinite(table["dose"].to_numpy(float))]
    if series["dose"].nunique() < 2:
        return table.iloc[0:0].assign(run=[])
    order = [c for c in ("dose", "seed", "step") if c in series]
    series = series.sort_values(order, kind="stable").reset_index(drop=True)
    seeds = series["seed"] if "seed" in series else pd.Series(np.nan, index=series.index)
    runs = [
        f"lambda={d:g}/seed={format_number(s, '.0f')}"
        for d, s in zip(series["dose"], seeds, strict=True)
    ]
    # checkpoints share their run's key (trajectories): only the keys are checked here
    keys = Units(tuple(runs), tuple(map(str, seeds)), UNIT, tuple(map(str, series["model"])))
    check_units(keys, "the dose series", one_row_per_unit=False)
    return series.assign(run=runs)


def final_runs(series: pd.DataFrame) -> pd.DataFrame:
    """One row per training run: its network that trained the most steps (the final one)."""
    if series.empty:
        return series
    last = series.sort_values("step", kind="stable").groupby("run", sort=False).tail(1)
    return last.sort_values(["dose", "seed"], kind="stable").reset_index(drop=True)


def trajectories(table: pd.DataFrame) -> pd.DataFrame:
    """The runs with checkpoints, every checkpoint a row by step, led by the run's step 0: the
    untrained zoo network of the same seed (family control, 0 steps), which every run of that
    seed starts from and which is listed once, as a control."""
    series = dose_series(table)
    counts = series.groupby("run")["model"].transform("size") if len(series) else []
    rows = series[np.asarray(counts) > 1] if len(series) else series
    if rows.empty:
        return rows
    controls = table[(table.get("family") == "control") & (table.get("step") == 0)]
    starts = []
    for run, group in rows.groupby("run", sort=False):
        start = controls[controls["seed"] == group["seed"].iloc[0]]
        if len(start) and (group["step"] > 0).all():
            starts.append(start.iloc[:1].assign(run=run, dose=group["dose"].iloc[0]))
    out = pd.concat([*starts, rows], ignore_index=True)
    return out.sort_values(["run", "step"], kind="stable").reset_index(drop=True)


def _standardised(finals: pd.DataFrame, metric: str) -> float:
    """sd(binding) / sd(metric) within seeds, both taken on the deviations from each seed's
    mean (the degrees of freedom cancel): turns a slope into a standardised one without letting
    differences between seeds, which the per-seed slopes do not see, enter the scale."""
    seeds = finals["seed"].astype(str)
    within = {
        column: finals[column].astype(float) - finals.groupby(seeds)[column].transform("mean")
        for column in ("binding", metric)
    }
    ss_metric = float((within[metric] ** 2).sum())
    ss_binding = float((within["binding"] ** 2).sum())
    return float(np.sqrt(ss_binding / ss_metric)) if ss_metric > 0 else np.nan


def run_units(finals: pd.DataFrame) -> Units:
    """The units of the final runs: the run, its seed the block, named by the model."""
    return Units(
        tuple(map(str, finals["run"])),
        tuple(map(str, finals["seed"])),
        UNIT,
        tuple(map(str, finals["model"])),
    )


def slope_row(finals: pd.DataFrame, metric: str, options: dict[str, Any]) -> dict[str, Any]:
    """Step 1 of the analysis for one metric over the final runs (one row per run) that have
    a value of it and of binding."""
    finals = finals[np.isfinite(finals[[metric, "binding"]].astype(float)).all(axis=1)]
    x, y = finals["binding"].to_numpy(float), finals[metric].to_numpy(float)
    units = run_units(finals)
    confidence = options.get("confidence", 0.95)
    slopes = rep.block_slopes(x, y, units, confidence=confidence)
    scale = _standardised(finals, metric)
    r, r_p, _ = stats.pearson(x, y)
    boot = rep.cluster_bootstrap(
        lambda rows: float(stats.rowwise_pearson(x[rows], y[rows])),
        units,
        n_boot=options.get("n_boot", 2000),
        seed=options.get("seed", 0),
        confidence=confidence,
    )
    perm = rep.blocked_permutation(x, y, units, n_perm=N_PERMUTATIONS, seed=options.get("seed", 0))
    fixed = rep.fixed_effects_slope(x, y, units, confidence=confidence)
    return {
        "analysis": "slope on binding",
        "metric": metric,
        "estimate": slopes.mean,
        "ci_low": slopes.low,
        "ci_high": slopes.high,
        "p": slopes.p,
        "p_exact": slopes.p_exact,
        "n_seeds": slopes.n_blocks,
        "std_estimate": slopes.mean * scale,
        "std_ci_low": slopes.low * scale,
        "std_ci_high": slopes.high * scale,
        "pearson_r": r,
        "pearson_p": r_p,
        "pearson_p_exact": exact_correlation_p(x, y, seed=options.get("seed", 0)),
        "pearson_ci_low": boot.low,
        "pearson_ci_high": boot.high,
        "permutation_p_greater": perm.p_greater,
        "permutation_p_two_sided": perm.p_two_sided,
        "n_permutations": perm.n_permutations,
        "permutation_exact": perm.exact,
        "fe_slope": fixed.slope,
        "fe_ci_low": fixed.low,
        "fe_ci_high": fixed.high,
        "fe_p": fixed.p,
        "fe_df": fixed.df,
        "note": "; ".join(n for n in (slopes.note, fixed.note) if n),
    }


def comparison_row(
    finals: pd.DataFrame, sensitivity: str, geometry: str, confidence: float
) -> dict[str, Any]:
    """Step 2 for one pair: per seed, |standardised slope of ``sensitivity``| minus that of
    ``geometry`` (each standardised by its SD within seeds, :func:`_standardised`), t-interval over
    seeds, with the t p and the exact sign-flip p of the differences. Positive: the sensitivity
    metric moves more per SD of binding."""
    x, units = finals["binding"].to_numpy(float), run_units(finals)
    per_metric = {}
    for metric in (sensitivity, geometry):
        slopes = rep.block_slopes(x, finals[metric].to_numpy(float), units).slopes
        per_metric[metric] = {s: abs(v) * _standardised(finals, metric) for s, v in slopes.items()}
    common = [s for s in per_metric[sensitivity] if s in per_metric[geometry]]
    diffs = [per_metric[sensitivity][s] - per_metric[geometry][s] for s in common]
    mean, _, low, high, p = rep.t_interval(diffs, confidence)
    return {
        "analysis": "|std slope| difference",
        "metric": f"{sensitivity} - {geometry}",
        "estimate": mean,
        "ci_low": low,
        "ci_high": high,
        "p": p,
        "p_exact": exact_p(diffs),
        "n_seeds": len(common),
        "note": "" if len(common) >= 2 else "fewer than 2 seeds with both slopes: no interval",
    }


COLUMNS = [
    "models",
    "analysis",
    "metric",
    "unit",
    "n",
    "n_seeds",
    "n_doses",
    "estimate",
    "ci_low",
    "ci_high",
    "p",
    "p_exact",
    "std_estimate",
    "std_ci_low",
    "std_ci_high",
    "pearson_r",
    "pearson_p",
    "pearson_p_exact",
    "pearson_ci_low",
    "pearson_ci_high",
    "permutation_p_greater",
    "permutation_p_two_sided",
    "n_permutations",
    "permutation_exact",
    "fe_slope",
    "fe_ci_low",
    "fe_ci_high",
    "fe_p",
    "fe_df",
    "binding_min",
    "binding_max",
    "dose_min",
    "dose_max",
    "confidence",
    "note",
]


def dose_analysis(finals: pd.DataFrame, options: dict[str, Any]) -> pd.DataFrame:
    """Steps 1 and 2 over ``finals``, which must hold one row per training run: rows of one run
    (checkpoints pooled with their final network) are refused, naming them."""
    check_units(run_units(finals), "the dose series analysis")
    metrics = series_metrics(finals)
    rows = [slope_row(finals, metric, options) for metric in metrics]
    confidence = options.get("confidence", 0.95)
    for sensitivity in [m for m in metrics if m in SENSITIVITY]:
        for geometry in geometry_metrics(metrics):
            rows.append(comparison_row(finals, sensitivity, geometry, confidence))
    frame = pd.DataFrame(rows)
    frame["n"] = len(finals)
    frame["n_doses"] = int(finals["dose"].nunique())
    for column in ("binding", "dose"):
        frame[f"{column}_min"] = float(finals[column].min())
        frame[f"{column}_max"] = float(finals[column].max())
    return frame


def dose_correlations(table: pd.DataFrame, options: dict[str, Any]) -> pd.DataFrame:
    """``dose_series.csv``: the pre-registered analysis over the final network of every run of
    the series (:func:`dose_analysis`); a note and no numbers when the config has no series."""
    finals = final_runs(dose_series(table))
    if finals.empty:
        frame = pd.DataFrame(
            [{"analysis": "slope on binding", "metric": "jer", "n": 0, "n_seeds": 0}]
        )
        frame["note"] = (
            "no dose series in this config (two or more doses of series.dose, hparams.slot_weight)"
        )
        frame["n_doses"] = 0
    else:
        frame = dose_analysis(finals, options)
    frame["models"] = SERIES
    frame["unit"] = UNIT
    frame["confidence"] = options.get("confidence", 0.95)
    return frame.reindex(columns=COLUMNS)


def dose_figure(
    models: pd.DataFrame,
    *,
    binding_column: str = "binding",
    chance: float | None = None,
    label: str = "binding accuracy",
) -> Any:
    """Three panels: binding against the dose (one line per seed, final networks), JER against
    binding over the final networks (one point per training run, Pearson r and n runs), and
    binding and JER against the training step for each run with checkpoints (from step 0, the
    untrained control of its seed)."""
    import matplotlib.pyplot as plt

    from repdiag.common.figures import cycle_colour, interval_yerr

    final = final_runs(dose_series(models))
    fig, axes = plt.subplots(1, 3, figsize=(13.0, 4.0), layout="constrained")
    dose_ax, jer_ax, step_ax = axes
    if final.empty:
        for ax in axes:
            ax.text(0.5, 0.5, "no dose series in this config", ha="center", transform=ax.transAxes)
        return fig
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
    dose_ax.set(xlabel="dose lambda (weight of the slot labels)", ylabel=label)
    r, _, _ = stats.pearson(final["binding"].to_numpy(float), final["jer"].to_numpy(float))
    scatter = jer_ax.scatter(
        final["binding"], final["jer"], c=np.log10(final["dose"] + 1e-3), cmap="viridis"
    )
    fig.colorbar(scatter, ax=jer_ax, label="log10(lambda + 0.001)")
    jer_ax.set(
        xlabel=label,
        ylabel="JER (effective rank, directions)",
        title=f"final networks: r = {format_number(r, '.2f')} (n = {len(final)} runs)",
    )
    step_twin = step_ax.twinx()
    paths = trajectories(models)
    runs = list(paths.groupby("run", sort=False)) if len(paths) else []
    for i, (_, rows) in enumerate(runs):
        rows = rows.sort_values("step")
        label = f"lambda {rows['dose'].iloc[0]:g}, seed {rows['seed'].iloc[0]:.0f}"
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

"""The family comparison's within-run split (a secondary analysis of the second design,
pre-registered in docs/binding.md): what the checkpoints saved inside each run add.

Each training run j of unit i (objective x backbone) is seen at its first saved step and at its
final step (``save_at``, :func:`repdiag.binding.analysis.units.saved_steps`). Issue 58's model,

    y_ijs = a + b_B xbar_i + b_W (x_ijs - xbar_ij) + c log(s) + u_i + v_ij + e_ijs,

is estimated in its two parts without the variance model:

* **within a run**, b_W and the shared effect of training on: with the two steps of a run,
  the fixed-effects estimate with log(step) in the model is the OLS line of
  ``dy_ij = y_ij(last) - y_ij(first)`` on ``dx_ij`` with an intercept (the intercept is the
  change every run shares, c times the change in log step); t interval on n_runs - 2 df, and a
  permutation p (the runs' dx shuffled against their dy, :func:`repdiag.common.exact.permutation_correlation_p`,
  the same test as the slope's);
* **between units**, b_B: the OLS line of the units' mean y on their mean x (each unit's runs
  and steps averaged), t on k - 2 df, with the permutation p beside it.

A run's intermediate saved steps (more than one ``save_at``) are not used here: first and last.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from repdiag.binding import APART_FAMILIES
from repdiag.binding.analysis.units import saved_steps, with_units
from repdiag.common.exact import permutation_correlation_p
from repdiag.common.mixed import line_fit

WITHIN_RUN_COLUMNS = [
    "metric", "target", "n_runs", "n_units", "first_step", "last_step",
    "within", "within_low", "within_high", "within_p", "within_permutation_p",
    "shared_change", "shared_change_low", "shared_change_high",
    "between", "between_low", "between_high", "between_p", "between_permutation_p",
    "confidence", "note",
]  # fmt: skip


def run_steps(table: pd.DataFrame) -> pd.DataFrame:
    """The objective families' networks with the step they were saved at: every final network
    and every step saved inside its run (``training_run``, ``unit``, ``step``, ``saved``)."""
    table = with_units(table) if "training_run" not in table else table
    rows = table[~table["family"].isin(APART_FAMILIES)].copy()
    rows["saved"] = saved_steps(rows).to_numpy()
    rows["step"] = pd.to_numeric(rows.get("step"), errors="coerce")
    return rows.reset_index(drop=True)


def run_changes(rows: pd.DataFrame, metric: str, target: str = "binding") -> pd.DataFrame:
    """Per training run with a saved step and its final network, both finite in ``metric`` and
    ``target``: ``dx``, ``dy`` (last minus first), the steps, and the run's unit."""
    changes = []
    for run, group in rows.groupby("training_run", sort=True):
        group = group[np.isfinite(group[[metric, target]].astype(float)).all(axis=1)]
        if len(group) < 2 or not group["saved"].any() or group["saved"].all():
            continue
        group = group.sort_values("step")
        first, last = group.iloc[0], group.iloc[-1]
        changes.append({
            "training_run": run, "unit": last["unit"],
            "first_step": first["step"], "last_step": last["step"],
            "dx": float(last[metric]) - float(first[metric]),
            "dy": float(last[target]) - float(first[target]),
        })  # fmt: skip
    return pd.DataFrame(
        changes, columns=["training_run", "unit", "first_step", "last_step", "dx", "dy"]
    )


def _steps(changes: pd.DataFrame, column: str) -> float:
    values = changes[column].unique()
    return float(values[0]) if len(values) == 1 else math.nan


def within_run_row(
    rows: pd.DataFrame, metric: str, confidence: float, seed: int, target: str = "binding"
) -> dict:
    """One row of :func:`within_run_table`."""
    changes = run_changes(rows, metric, target)
    row = {"metric": metric, "target": target, "n_runs": len(changes),
           "n_units": changes["unit"].nunique(), "confidence": confidence}  # fmt: skip
    notes = []
    if len(changes) >= 3:
        line = line_fit(changes["dx"], changes["dy"], confidence)
        row |= {"within": line.slope, "within_low": line.slope_low,
                "within_high": line.slope_high, "within_p": line.slope_p,
                "within_permutation_p": permutation_correlation_p(
                    changes["dx"], changes["dy"], seed=seed),
                "shared_change": line.intercept, "shared_change_low": line.intercept_low,
                "shared_change_high": line.intercept_high,
                "first_step": _steps(changes, "first_step"),
                "last_step": _steps(changes, "last_step")}  # fmt: skip
    else:
        notes.append(f"{len(changes)} runs with a saved step and a final network: no within-run "
                     "slope (it needs 3)")  # fmt: skip
    finite = rows[np.isfinite(rows[[metric, target]].astype(float)).all(axis=1)]
    means = finite.groupby("unit")[[metric, target]].mean()
    if len(means) >= 3:
        line = line_fit(means[metric], means[target], confidence)
        row |= {"between": line.slope, "between_low": line.slope_low,
                "between_high": line.slope_high, "between_p": line.slope_p,
                "between_permutation_p": permutation_correlation_p(
                    means[metric], means[target], seed=seed)}  # fmt: skip
    else:
        notes.append(f"{len(means)} units: no between-unit slope (it needs 3)")
    row["note"] = "; ".join(notes)
    return row


def within_run_table(
    table: pd.DataFrame, metrics: Sequence[str], confidence: float, seed: int
) -> pd.DataFrame:
    """``within_run.csv``: per metric, the within-run slope of the binding score on it (with the
    change all runs share) and the between-unit slope (module docstring)."""
    rows = run_steps(table)
    present = [m for m in metrics if m in rows.columns]
    frame = pd.DataFrame(
        [within_run_row(rows, m, confidence, seed) for m in present], columns=WITHIN_RUN_COLUMNS
    )
    frame["note"] = frame["note"].fillna("")
    return frame

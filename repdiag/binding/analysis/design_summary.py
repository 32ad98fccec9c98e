"""The family comparison's own sections of its summary.md (docs/binding.md, the second design):
the pre-registered primary family with its Holm-adjusted p's and power, and the within-run
split the checkpoints add. Rendered from ``primary.csv`` and ``within_run.csv`` as written."""

from __future__ import annotations

import math

import pandas as pd

from repdiag.binding.analysis.options import StatsSettings
from repdiag.binding.analysis.statistics import family_means
from repdiag.common.tables import format_number as _num
from repdiag.common.tables import markdown_table


def _interval(row: pd.Series, value: str, low: str, high: str) -> str:
    return f"{_num(row[value])} [{_num(row[low], '.2f')}, {_num(row[high], '.2f')}]"


def primary_section(primary: pd.DataFrame, confidence: float) -> list[str]:
    """``## Pre-registered primary family``: one row per test, r over the units with its
    bootstrap interval, the t p and the permutation p, both Holm-adjusted over the family, the
    verdict (from the adjusted permutation p) and what the test's n could detect."""
    if not len(primary):
        return []
    first = primary.iloc[0]
    rows = [
        {
            "test": f"r({row['metric']}, {row['binding_score']})",
            "n units (runs)": f"{_num(row['n'], '.0f')} ({_num(row['n_runs'], '.0f')})",
            f"r [{confidence:.0%} CI]": _interval(
                row, "pearson_r", "pearson_ci_low", "pearson_ci_high"
            ),
            "t p": _num(row["pearson_p"], ".3g"),
            "permutation p": _num(row["permutation_p"], ".3g"),
            "Holm t p": _num(row["holm_p"], ".3g"),
            "Holm permutation p": _num(row["holm_permutation_p"], ".3g"),
            "rejected": "yes" if bool(row["rejected"]) else "no",
            "power at the paper's r (Holm's first step)": f"{_num(row['power_at_paper_r'], '.2f')} "
            f"({_num(row['power_at_paper_r_holm_first'], '.2f')})",
            "smallest r, 80% power": _num(row["r_detectable_80"], ".2f"),
        }
        for _, row in primary.iterrows()
    ]
    return [
        "## Pre-registered primary family",
        "",
        f"Unit: {first['unit']}, final networks only; Holm over "
        f"{int(first['family_size'])} tests; a test is rejected where its Holm-adjusted "
        f"permutation p is at most {_num(first['reject_at'], 'g')} (`primary.csv`).",
        "",
        markdown_table(pd.DataFrame(rows)),
        "",
    ]


def within_run_section(within: pd.DataFrame) -> list[str]:
    """``## Within-run split``: per metric, the slope of the score's change inside a run on the
    metric's change (first saved step to the end), the change every run shares, and the
    between-unit slope through the units' means, each with its interval and both p's."""
    if not len(within):
        return []
    first = within.iloc[0]
    rows = [
        {
            "metric": row["metric"],
            "runs (units)": f"{_num(row['n_runs'], '.0f')} ({_num(row['n_units'], '.0f')})",
            "within-run slope": _interval(row, "within", "within_low", "within_high"),
            "within t p (perm. p)": f"{_num(row['within_p'], '.3g')} "
            f"({_num(row['within_permutation_p'], '.3g')})",
            "change all runs share": _interval(
                row, "shared_change", "shared_change_low", "shared_change_high"
            ),
            "between-unit slope": _interval(row, "between", "between_low", "between_high"),
            "between t p (perm. p)": f"{_num(row['between_p'], '.3g')} "
            f"({_num(row['between_permutation_p'], '.3g')})",
        }
        for _, row in within.iterrows()
    ]
    steps = (
        f"step {_num(first['first_step'], '.0f')} to {_num(first['last_step'], '.0f')}"
        if math.isfinite(float(first["first_step"]))
        else "its saved step to its end (no run has both here)"
    )
    notes = sorted({str(n) for n in within["note"].fillna("") if str(n)})
    return [
        "## Within-run split",
        "",
        f"Secondary, not in the Holm family: each run's change from {steps} "
        f"({float(first['confidence']):.0%} intervals; `within_run.csv`).",
        "",
        markdown_table(pd.DataFrame(rows)),
        "",
        *([f"Notes: {'; '.join(notes)}.", ""] if notes else []),
    ]


def units_section(models: pd.DataFrame, settings: StatsSettings) -> list[str]:
    """``## Units``: each unit of the comparison (objective x backbone, final networks, seeds
    averaged) with the scores and metrics the primary family correlates, best-binding first."""
    means = family_means(models)
    if not len(means):
        return []
    accuracy = f"binding_{settings.readout}"
    columns = {"unit": "unit", "n_runs": "runs", "binding": f"{settings.binding_score.replace('_', ' ')} (primary)",
               accuracy: "accuracy", "jer": "JER", "g_pr": "G.PR", "g_iso": "G.Iso",
               "same_different": "Same/Different"}  # fmt: skip
    present = [c for c in columns if c in means]
    table = means.sort_values("binding", ascending=False)[present].rename(columns=columns)
    return [
        "## Units",
        "",
        f"Final networks, each unit's mean over its seeds ({settings.readout} readout; JER "
        f"{settings.jer_formula} at the {settings.jer_at} tap).",
        "",
        markdown_table(table),
        "",
    ]

"""The dose series in two realisations side by side (rule ``replicate_comparison``).

The main run's ``results/tables/dose_series.csv`` and the replicate's
(``results/binding_replicate/dose_series.csv``: the same grid, every run carrying a null push,
:mod:`repdiag.binding.replicate_options`) hold the same pre-registered analysis over two draws of
training's chaos. Each verdict is stated at the level of its pre-registered family, Holm-adjusted
over the family's t p in each realisation (the exact sign-flip p beside it: with 4 seeds its
floor is 0.125, so it can never call a difference and is shown, not tested):

- ``slopes``: the per-seed slope on binding of each metric (JER, pr, pr2, G.PR, G.Iso, each
  L.Iso, Same/Different);
- ``JER - geometry``: the |standardised slope| of top-k JER minus that of each geometry metric
  (the paper's question);
- ``pr/pr2 - geometry``: the same for the full-spectrum pr and pr2 (sensitivity).

A verdict is ``holds in both`` or ``cannot tell in both`` when the two realisations agree at
their family's level, and ``varies between runs`` (both p given) when they do not.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from repdiag.common.exact import holm

ALPHA = 0.05
REALISATIONS = ("main", "replicate")


def family_of(analysis: str, metric: str) -> str:
    """The pre-registered family of one row of dose_series.csv."""
    if analysis == "slope on binding":
        return "slopes"
    return "JER - geometry" if metric.startswith("jer - ") else "pr/pr2 - geometry"


def with_families(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (a dose_series.csv) with ``family``, ``family_size`` and ``p_holm`` (Holm over the
    family's t p), rows without an estimate (a note-only table) dropped."""
    rows = table[np.isfinite(pd.to_numeric(table["estimate"], errors="coerce"))].copy()
    rows["family"] = [
        family_of(a, m) for a, m in zip(rows["analysis"], rows["metric"], strict=True)
    ]
    rows["p_holm"] = np.nan
    rows["family_size"] = 0
    for _, part in rows.groupby("family", sort=False):
        rows.loc[part.index, "p_holm"] = holm(part["p"].to_numpy(float))
        rows.loc[part.index, "family_size"] = len(part)
    return rows


def verdict(holds: tuple[bool, bool]) -> str:
    if holds[0] and holds[1]:
        return "holds in both"
    if not holds[0] and not holds[1]:
        return "cannot tell in both"
    return "varies between runs"


def compare_realisations(main: pd.DataFrame, replicate: pd.DataFrame) -> pd.DataFrame:
    """One row per (analysis, metric) present in both: each realisation's estimate, interval, t
    p, exact p and Holm p, and the verdict at ``ALPHA`` (module docstring)."""
    keys = ["family", "analysis", "metric"]
    kept = ["estimate", "ci_low", "ci_high", "p", "p_exact", "p_holm", "n", "n_seeds"]
    sides = [
        with_families(table)
        .reindex(columns=[*keys, "family_size", *kept])
        .rename(columns={c: f"{c}_{name}" for c in ["family_size", *kept]})
        for name, table in zip(REALISATIONS, (main, replicate), strict=True)
    ]
    both = sides[0].merge(sides[1], on=keys, how="inner")
    both["verdict"] = [
        verdict((a <= ALPHA, b <= ALPHA))
        for a, b in zip(both["p_holm_main"], both["p_holm_replicate"], strict=True)
    ]
    both["alpha"] = ALPHA
    return both.reset_index(drop=True)


def _cell(row: pd.Series, side: str) -> str:
    estimate, low, high = (row[f"{c}_{side}"] for c in ("estimate", "ci_low", "ci_high"))
    text = f"{estimate:.3f} [{low:.2f}, {high:.2f}]" if np.isfinite(low) else f"{estimate:.3f}"
    return (
        f"{text}, p = {row[f'p_{side}']:.2g} (Holm {row[f'p_holm_{side}']:.2g}; exact "
        f"{row[f'p_exact_{side}']:.2g})"
    )


def comparison_markdown(comparison: pd.DataFrame) -> str:
    """``results/binding_replicate/comparison.md``: per family, both realisations side by side."""
    lines = [
        "# The dose series in two realisations",
        "",
        "The main run's dose series and its replicate (the same grid, every run carrying a "
        "negligible push: another draw of training's chaos). Unit: the training run; n = seeds "
        "per interval (t-interval over seeds). Each verdict is at Holm's level over its "
        f"pre-registered family's t p (alpha = {ALPHA:g}) in each realisation; the exact "
        "sign-flip p is shown beside (floor 0.125 at 4 seeds).",
        "",
    ]
    if comparison.empty:
        return "\n".join([*lines, "No rows in common: run `make run` and the replicate.", ""])
    for family, part in comparison.groupby("family", sort=False):
        size = int(part["family_size_main"].iloc[0])
        lines += [f"## {family} ({size} tests)", ""]
        lines += ["| metric | main | replicate | verdict |", "|---|---|---|---|"]
        for _, row in part.iterrows():
            lines.append(
                f"| {row['metric']} | {_cell(row, 'main')} | {_cell(row, 'replicate')} | "
                f"{row['verdict']} |"
            )
        lines.append("")
    counts = comparison["verdict"].value_counts()
    lines.append(
        "Verdicts: "
        + ", ".join(
            f"{counts.get(v, 0)} {v}"
            for v in ("holds in both", "cannot tell in both", "varies between runs")
        )
        + "."
    )
    return "\n".join([*lines, ""])

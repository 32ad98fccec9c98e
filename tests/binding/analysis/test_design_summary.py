"""The family comparison's sections of its summary (repdiag.binding.analysis.design_summary): the
numbers shown are the tables' own, each test's row in its place."""

from __future__ import annotations

import pandas as pd

from repdiag.binding.analysis.design_summary import (
    primary_section,
    units_section,
    within_run_section,
)
from repdiag.binding.analysis.primary import primary_table
from repdiag.binding.analysis.within_run import within_run_table

from .test_primary import SETTINGS, unit_table
from .test_within_run import B_WITHIN, SHARED, runs_table


def cells(lines: list[str]) -> list[list[str]]:
    """The rows of the one markdown table in ``lines``, header first, cells stripped."""
    rows = [line for line in "\n".join(lines).splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for i, row in enumerate(rows) if i != 1]


def test_the_primary_section_shows_each_tests_r_p_holm_verdict_and_power():
    primary = primary_table(unit_table(), SETTINGS, ["jer", "g_pr"])
    lines = primary_section(primary, 0.95)
    assert lines[0] == "## Pre-registered primary family" and lines[-1] == ""
    assert "Holm over 2 tests" in lines[2] and "at most 0.05" in lines[2]
    header, *rows = cells(lines)
    by_test = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    assert list(by_test) == ["r(jer, win_rate)", "r(g_pr, win_rate)"]
    for metric, (_, row) in zip(["jer", "g_pr"], primary.iterrows(), strict=True):
        shown = by_test[f"r({metric}, win_rate)"]
        assert shown["n units (runs)"] == "14 (14)"
        assert shown["r [95% CI]"] == (
            f"{row['pearson_r']:.3f} [{row['pearson_ci_low']:.2f}, {row['pearson_ci_high']:.2f}]"
        )
        assert shown["Holm permutation p"] == format(row["holm_permutation_p"], ".3g")
        assert shown["rejected"] == ("yes" if row["rejected"] else "no")
        assert shown["power at the paper's r (Holm's first step)"] == "0.83 (0.75)"
    assert by_test["r(jer, win_rate)"]["rejected"] == "yes"


def test_the_within_run_section_shows_the_recovered_slopes_and_the_steps():
    within = within_run_table(runs_table(), ["jer"], 0.95, seed=0)
    lines = within_run_section(within)
    assert lines[0] == "## Within-run split" and "step 1000 to 3000" in lines[2]
    header, row = cells(lines)
    shown = dict(zip(header, row, strict=True))
    assert shown["metric"] == "jer" and shown["runs (units)"] == "15 (5)"
    assert shown["within-run slope"].startswith(f"{B_WITHIN:.3f} [")
    assert shown["change all runs share"].startswith(f"{SHARED:.3f} [")


def test_empty_tables_add_no_section():
    assert primary_section(pd.DataFrame(), 0.95) == []
    assert within_run_section(pd.DataFrame()) == []


def test_a_test_without_numbers_shows_n_a_and_runs_without_saved_steps_say_so():
    primary = primary_table(unit_table(n=2), SETTINGS, ["jer", "missing"])
    header, *rows = cells(primary_section(primary, 0.95))
    shown = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    assert shown["r(missing, win_rate)"]["n units (runs)"] == "n/a (n/a)"
    assert shown["r(missing, win_rate)"]["rejected"] == "no"
    within = within_run_table(runs_table(saved=False), ["jer"], 0.95, seed=0)
    lines = within_run_section(within)
    assert "no run has both here" in lines[2] and "0 runs with a saved step" in lines[-2]


def test_the_units_section_lists_each_units_seed_mean_best_binding_first():
    models = runs_table()  # 5 objectives x 3 seeds, each at its end and a saved step
    lines = units_section(models, SETTINGS)
    assert lines[0] == "## Units"
    header, *rows = cells(lines)
    shown = [dict(zip(header, row, strict=True)) for row in rows]
    assert [row["runs"] for row in shown] == ["3"] * 5  # the saved steps are not networks
    finals = models[~models["model"].str.endswith("_step1000")]
    expected = finals.groupby(finals["model"].str.split("_s").str[0])["binding"].mean()
    assert [float(row["win rate (primary)"]) for row in shown] == sorted(
        expected.round(3), reverse=True
    )

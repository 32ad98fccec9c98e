"""The dose series in two realisations: families, Holm within each, verdicts side by side."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from repdiag.binding.replicate import compare_realisations, comparison_markdown, with_families


def dose_table(p: dict[str, float]) -> pd.DataFrame:
    """A dose_series.csv with three slopes and two JER - geometry rows, t p as given."""
    rows = [
        ("slope on binding", "jer"),
        ("slope on binding", "g_pr"),
        ("slope on binding", "same_different"),
        ("|std slope| difference", "jer - g_pr"),
        ("|std slope| difference", "jer - g_iso"),
        ("|std slope| difference", "pr_full - g_pr"),
    ]
    return pd.DataFrame(
        [
            {
                "analysis": analysis,
                "metric": metric,
                "estimate": 0.5,
                "ci_low": 0.1,
                "ci_high": 0.9,
                "p": p[metric],
                "p_exact": 0.125,
                "n": 16,
                "n_seeds": 4,
            }
            for analysis, metric in rows
        ]
    )


MAIN = {"jer": 0.001, "g_pr": 0.04, "same_different": 0.0002, "jer - g_pr": 0.014}
MAIN |= {"jer - g_iso": 0.5, "pr_full - g_pr": 0.02}
REPLICATE = {**MAIN, "jer - g_pr": 0.10, "g_pr": 0.3}


def test_families_and_holm_within_each() -> None:
    table = with_families(dose_table(MAIN)).set_index("metric")
    assert table.loc["jer", "family"] == "slopes" and table.loc["jer", "family_size"] == 3
    assert table.loc["jer - g_iso", "family"] == "JER - geometry"
    assert table.loc["pr_full - g_pr", "family"] == "pr/pr2 - geometry"
    # slopes: p 0.0002, 0.001, 0.04 -> Holm 0.0006, 0.002, 0.04
    assert table.loc["same_different", "p_holm"] == pytest.approx(0.0006)
    assert table.loc["jer", "p_holm"] == pytest.approx(0.002)
    assert table.loc["g_pr", "p_holm"] == pytest.approx(0.04)
    # JER - geometry: 0.014 and 0.5 -> 0.028 and 0.5; pr alone: unchanged
    assert table.loc["jer - g_pr", "p_holm"] == pytest.approx(0.028)
    assert table.loc["pr_full - g_pr", "p_holm"] == pytest.approx(0.02)


def test_a_verdict_that_differs_between_realisations_varies_between_runs() -> None:
    comparison = compare_realisations(dose_table(MAIN), dose_table(REPLICATE)).set_index("metric")
    assert comparison.loc["jer", "verdict"] == "holds in both"
    assert comparison.loc["jer - g_iso", "verdict"] == "cannot tell in both"
    assert comparison.loc["jer - g_pr", "verdict"] == "varies between runs"
    assert comparison.loc["g_pr", "verdict"] == "varies between runs"
    assert comparison.loc["jer - g_pr", "p_main"] == 0.014
    assert comparison.loc["jer - g_pr", "p_replicate"] == 0.10
    text = comparison_markdown(comparison.reset_index())
    assert "## JER - geometry (2 tests)" in text and "varies between runs" in text
    assert "Verdicts: 3 holds in both, 1 cannot tell in both, 2 varies between runs." in text


def test_a_note_only_table_compares_nothing() -> None:
    empty = pd.DataFrame(
        [{"analysis": "slope on binding", "metric": "jer", "estimate": np.nan, "p": np.nan}]
    )
    comparison = compare_realisations(empty, dose_table(MAIN))
    assert comparison.empty and "No rows in common" in comparison_markdown(comparison)

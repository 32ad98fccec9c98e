"""The family comparison's pre-registered primary family (repdiag.binding.analysis.primary):
r, interval and p from the correlation table, the permutation p over units, Holm over the family
computed by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.binding.analysis.options import StatsSettings
from repdiag.binding.analysis.primary import PRIMARY_COLUMNS, primary_table
from repdiag.common.exact import permutation_correlation_p

SETTINGS = StatsSettings.from_config({"n_bootstrap": 200, "seed": 0, "binding_score": "win_rate"})


def unit_table(n: int = 14, seed: int = 0) -> pd.DataFrame:
    """``n`` units: binding follows jer closely, g_pr weakly, g_iso not at all."""
    rng = np.random.default_rng(seed)
    jer = rng.normal(size=n)
    return pd.DataFrame(
        {
            "model": [f"u{i}" for i in range(n)],
            "unit": [f"objective{i}" for i in range(n)],
            "training_run": [f"objective{i}, seed 0" for i in range(n)],
            "n_runs": 1,
            "family": "contrastive",
            "binding": 0.5 + 0.1 * jer + 0.01 * rng.normal(size=n),
            "jer": jer,
            "g_pr": rng.normal(size=n) + 0.3 * jer,
            "g_iso": rng.normal(size=n),
        }
    )


def test_the_primary_rows_are_the_correlations_with_holm_over_the_family():
    means = unit_table()
    table = primary_table(means, SETTINGS, ["jer", "g_pr"])
    assert list(table.columns) == PRIMARY_COLUMNS and list(table["metric"]) == ["jer", "g_pr"]
    for _, row in table.iterrows():
        r, p = sps.pearsonr(means[row["metric"]], means["binding"])
        assert row["pearson_r"] == pytest.approx(r) and row["pearson_p"] == pytest.approx(p)
        expected = permutation_correlation_p(means[row["metric"]], means["binding"], seed=0)
        assert row["permutation_p"] == expected
        assert row["pearson_ci_low"] <= row["pearson_r"] <= row["pearson_ci_high"]
    # Holm by hand: the smaller p times 2, the larger times 1, then the running maximum
    ordered = sorted(table["pearson_p"])
    first, second = min(1.0, 2 * ordered[0]), min(1.0, max(2 * ordered[0], ordered[1]))
    by_p = dict(zip(table["pearson_p"], table["holm_p"], strict=True))
    assert by_p[ordered[0]] == pytest.approx(first) and by_p[ordered[1]] == pytest.approx(second)
    jer = table.set_index("metric").loc["jer"]
    assert bool(jer["rejected"]) and jer["holm_permutation_p"] <= 0.05  # r about 0.99 over 14
    assert set(table["family_size"]) == {2} and set(table["binding_score"]) == {"win_rate"}
    assert set(table["reject_at"]) == {0.05} and set(table["n"]) == {14}
    # what 14 units can detect, as docs/binding.md's design table gives it (power at r = 0.69:
    # 0.83 at 0.05, 0.75 at Holm's first step 0.025; 80% power from |r| 0.67)
    assert set(table["power_at_paper_r"].round(2)) == {0.83}
    assert set(table["power_at_paper_r_holm_first"].round(2)) == {0.75}
    assert set(table["r_detectable_80"].round(2)) == {0.67}


def test_a_metric_without_a_column_keeps_the_familys_size():
    """A pre-registered test that cannot be computed rejects nothing and does not make the
    others less strict: Holm still counts it (as p = 1)."""
    table = primary_table(unit_table(), SETTINGS, ["jer", "same_different"])
    missing = table.set_index("metric").loc["same_different"]
    assert np.isnan(missing["pearson_r"]) and "not a column" in missing["note"]
    assert np.isnan(missing["holm_p"]) and not bool(missing["rejected"])
    jer = table.set_index("metric").loc["jer"]
    assert jer["holm_p"] == pytest.approx(min(1.0, 2 * jer["pearson_p"]))

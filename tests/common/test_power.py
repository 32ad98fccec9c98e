"""Power of a correlation test: the issue's numbers, inverses of each other, and a simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from repdiag.common.power import (
    correlation_power,
    design_rows,
    design_table,
    detectable_correlation,
    units_needed,
)


def test_the_family_comparisons_numbers():
    """n = 7 objectives at the paper's r = 0.69: power 0.44 (a simulation of Pearson's test,
    20,000 draws: 0.443); |r| 0.87 detected at 80%; 14 units for 80% (simulated: 0.83)."""
    assert correlation_power(0.69, 7) == pytest.approx(0.443, abs=0.006)
    assert detectable_correlation(7) == pytest.approx(0.87, abs=0.005)
    assert units_needed(0.69) == 14
    assert correlation_power(0.69, 14) >= 0.8 > correlation_power(0.69, 13)


def test_the_functions_invert_each_other_and_the_edges():
    for n in (5, 10, 40):
        assert correlation_power(detectable_correlation(n, 0.9), n) == pytest.approx(0.9, abs=1e-6)
    assert correlation_power(0.0, 50) == pytest.approx(0.05)  # the level: no effect
    assert correlation_power(-0.5, 30) == correlation_power(0.5, 30)
    assert math.isnan(correlation_power(0.5, 3)) and math.isnan(detectable_correlation(3))
    with pytest.raises(ValueError, match="alpha"):
        correlation_power(0.5, 10, alpha=1.5)
    with pytest.raises(ValueError, match="not be 0"):
        units_needed(0.0)


def test_the_power_matches_a_simulation_of_pearsons_test():
    """An independent check: the share of 4000 bivariate normal samples of n = 12 at r = 0.6
    whose Pearson p is below 0.05 (standard error 0.008; the uncorrected z is 0.032 low)."""
    rng = np.random.default_rng(0)
    n, r = 12, 0.6
    cov = [[1.0, r], [r, 1.0]]
    hits = sum(
        stats.pearsonr(*rng.multivariate_normal([0, 0], cov, n).T).pvalue < 0.05
        for _ in range(4000)
    )
    assert hits / 4000 == pytest.approx(correlation_power(r, n), abs=0.02)


def test_the_design_table_is_the_power_functions_at_both_levels():
    rows = design_rows(14, (0.69, 0.4), family_size=2)
    assert rows[0]["power"] == correlation_power(0.69, 14)
    assert rows[0]["power_holm_first"] == correlation_power(0.69, 14, 0.025)
    assert rows[0]["power_holm_first"] < rows[0]["power"]  # the stricter level has less power
    assert rows[0]["units_for_80"] == units_needed(0.69) == 14
    assert rows[1]["units_for_80_holm_first"] == units_needed(0.4, 0.8, 0.025)
    assert rows[-1]["detectable_80"] == detectable_correlation(14)
    table = design_table(14, (0.69,), 2)
    assert "| 0.69 | 0.83 | 0.75 | 14 | 16 |" in table  # docs/binding.md's second design

"""The between/within split against hand computations on synthetic tables of known slopes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats as sps

from repdiag.common.mixed import between_within
from repdiag.common.units import Units


def nested(groups: int, runs: int, b_between: float, b_within: float, seed: int = 0):
    """Runs nested in groups: group means of x far apart, y = 1 + b_B xbar + b_W (x - xbar)
    + u_group + noise."""
    rng = np.random.default_rng(seed)
    xbar = rng.normal(0.0, 2.0, groups)
    u = rng.normal(0.0, 0.3, groups)
    x, y, unit, block = [], [], [], []
    for i in range(groups):
        dev = rng.normal(0.0, 1.0, runs)
        dev -= dev.mean()  # xbar is the group's sample mean: the between slope is b_B itself
        x += list(xbar[i] + dev)
        y += list(1.0 + b_between * xbar[i] + b_within * dev + u[i] + rng.normal(0, 0.05, runs))
        unit += [f"g{i}_s{j}" for j in range(runs)]
        block += [f"g{i}"] * runs
    return np.array(x), np.array(y), Units(tuple(unit), tuple(block), name="training run")


def test_the_split_recovers_known_slopes_of_opposite_sign():
    """A pooled correlation would mix them; the split names each."""
    x, y, units = nested(groups=40, runs=3, b_between=2.0, b_within=-0.5)
    result = between_within(x, y, units)
    assert result.between == pytest.approx(2.0, abs=0.15)
    assert result.within == pytest.approx(-0.5, abs=0.05)
    assert result.between_low < 2.0 < result.between_high
    assert result.within_low < -0.5 < result.within_high
    assert result.n_groups == 40 and result.n_rows == 120
    assert result.between_df == 38 and result.within_df == 120 - 40 - 1


def test_each_slope_is_its_hand_computation_and_the_mixed_model_agrees():
    x, y, units = nested(groups=6, runs=4, b_between=1.0, b_within=0.3, seed=3)
    result = between_within(x, y, units)
    groups = np.array(units.block)
    names = sorted(set(groups))
    xm = np.array([x[groups == g].mean() for g in names])
    ym = np.array([y[groups == g].mean() for g in names])
    line = sps.linregress(xm, ym)  # the between slope: OLS over the 6 group means
    assert result.between == pytest.approx(line.slope, rel=1e-12)
    assert result.between_p == pytest.approx(line.pvalue, rel=1e-9)
    half = sps.t.ppf(0.975, 4) * line.stderr
    assert result.between_high - result.between == pytest.approx(half, rel=1e-9)
    xw = x - np.array([x[groups == g].mean() for g in groups])
    yw = y - np.array([y[groups == g].mean() for g in groups])
    assert result.within == pytest.approx(float(xw @ yw / (xw @ xw)), rel=1e-12)
    # Mundlak: the random-intercept fit's slopes are these (equal group sizes), to REML's tolerance
    assert result.mixed_within == pytest.approx(result.within, rel=1e-6)
    assert result.mixed_between == pytest.approx(result.between, rel=1e-4)
    assert result.group_sd > 0 and result.residual_sd > 0


def test_too_few_groups_or_no_spread_is_a_note_not_a_number():
    x, y, units = nested(groups=2, runs=3, b_between=1.0, b_within=1.0)
    result = between_within(x, y, units)
    assert math.isnan(result.between) and "2 groups" in result.note
    assert math.isfinite(result.within)  # within needs only rows: 6 - 2 - 1 = 3 df
    one_run_each = Units(tuple(f"r{i}" for i in range(5)), tuple(f"g{i}" for i in range(5)))
    single = between_within(np.arange(5.0), 2 * np.arange(5.0), one_run_each)
    assert single.between == pytest.approx(2.0) and math.isnan(single.within)
    assert math.isnan(single.mixed_between)  # no group has two runs: no random intercept

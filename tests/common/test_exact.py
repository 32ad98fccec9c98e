"""Exact and permutation tests and family adjustment (repdiag.common.exact): the sign-flip p and
the permutation p of Pearson r against exhaustive enumeration in exact arithmetic, their floors,
the Monte Carlo p counting the observed statistic as the +1, Holm's adjustment against a hand
computation and statsmodels, and the printed Monte Carlo floor."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from repdiag.common.exact import (
    exact_correlation_p,
    exact_p,
    format_p,
    format_permutation_p,
    holm,
    permutation_correlation_p,
    permutation_draws,
    sign_flip_p,
)
from repdiag.common.replication import t_interval


def enumerated_sign_flip_p(values) -> float:
    """The two-sided sign-flip p written out: every one of the 2^k sign vectors, in exact
    rational arithmetic (the values are integers or exact binary fractions), counting those
    whose |sum| reaches the observed |sum|."""
    from fractions import Fraction

    exact = [Fraction(v) for v in values]
    observed = abs(sum(exact))
    hits = sum(
        abs(sum(s * v for s, v in zip(signs, exact, strict=True))) >= observed
        for signs in itertools.product((1, -1), repeat=len(exact))
    )
    return hits / 2 ** len(exact)


@pytest.mark.parametrize("k", range(1, 9))
def test_sign_flip_p_is_the_exhaustive_enumeration(k):
    rng = np.random.default_rng(k)
    # small integers: ties between |values| and between sums are certain, and exact in floats
    integers = rng.integers(-3, 4, size=k).astype(float)
    assert sign_flip_p(integers) == pytest.approx(enumerated_sign_flip_p(integers), abs=1e-15)
    # continuous values on a grid of 2^-20 (exact binary fractions): no rounding in either sum
    grid = np.round(rng.normal(0.4, 1.0, size=k) * 2**20) / 2**20
    assert sign_flip_p(grid) == pytest.approx(enumerated_sign_flip_p(grid), abs=1e-15)


def test_sign_flip_p_ties_and_nan_and_its_floor():
    # [1, 1, -1, 3]: sum 4; sign vectors with |sum| >= 4: (+,+,-,+) -> 4, (+,+,+,+) -> 6,
    # (-,+,+,+) and (+,-,+,+) -> 4, and their four mirror images: 8 of 16
    assert sign_flip_p([1.0, 1.0, -1.0, 3.0]) == pytest.approx(8 / 16)
    assert sign_flip_p([1.0, np.nan, 1.0, -1.0, 3.0]) == pytest.approx(8 / 16)  # NaN dropped
    assert sign_flip_p([0.0, 0.0, 0.0]) == 1.0  # every assignment ties with a zero mean
    assert math.isnan(sign_flip_p([np.nan]))
    for k in range(1, 9):  # all of one sign: only the observed and its mirror reach it
        values = np.random.default_rng(k).uniform(0.5, 2.0, size=k)
        assert sign_flip_p(values) == pytest.approx(2 / 2**k)
        assert sign_flip_p(-values) == pytest.approx(2 / 2**k)


def test_sign_flip_p_monte_carlo_counts_the_observed_as_the_plus_one():
    # k = 20 > the 1000 draws allowed: sampled; all positive values, so a draw reaches the
    # observed |mean| only with its own signs or their mirror (probability 2 / 2^20 each)
    values = np.linspace(1.0, 2.0, 20)
    assert sign_flip_p(values, n_draws=1000, seed=3) == pytest.approx(1 / 1001)
    # a symmetric sample: about half the draws reach a mean that is nearly zero
    mixed = np.array([1.0, -1.0] * 10) + np.linspace(0.0, 0.01, 20)
    assert sign_flip_p(mixed, n_draws=4000, seed=1) > 0.5


def test_holm_against_a_hand_computation_and_statsmodels():
    from statsmodels.stats.multitest import multipletests

    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> 0.06
    # (running maximum); back in the input order
    p = [0.01, 0.04, 0.03, 0.005]
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm(p) == pytest.approx(multipletests(p, method="holm")[1])
    # capped at 1, monotone after the cap
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    # NaN members stay NaN and do not count toward m (m = 2: 0.01 x 2, 0.04 x 1)
    out = holm([0.01, np.nan, 0.04])
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    rng = np.random.default_rng(11)
    for size in (1, 3, 7, 12):
        draws = rng.uniform(0, 0.2, size=size)
        assert holm(draws) == pytest.approx(multipletests(draws, method="holm")[1])
    assert holm([]).size == 0


def test_format_p_prints_the_monte_carlo_floor_as_below_one_over_b():
    assert format_p(1 / 20001, 20000) == "< 5e-05"
    assert format_p(1 / 1001, 1000) == "< 0.001"
    assert format_p(2 / 20001, 20000) == "0.0001"  # one draw reached it: a number, not a bound
    assert format_p(0.01234, 20000) == "0.012"
    assert format_p(1 / 36) == "0.028"  # exact: no floor to state
    assert format_p(1 / 36, None) == "0.028"
    assert format_p(math.nan, 100) == "n/a"


def test_exact_p_is_the_sign_flip_p_up_to_ten_values():
    rng = np.random.default_rng(2)
    for k in range(2, 11):
        values = rng.normal(0.5, 1.0, size=k)
        assert exact_p(values) == sign_flip_p(values)
    assert exact_p([0.3, 0.5, np.nan]) == pytest.approx(2 / 4)  # two finite values, one sign
    assert math.isnan(exact_p([1.0])) and math.isnan(exact_p([]))  # no t p below 2 values
    assert math.isnan(exact_p(rng.normal(size=11)))  # above 10 the t p stands alone
    # four seeds all of one sign: the exact p cannot go below 2 / 2^4, whatever the t p says
    slopes = [2.01, 1.99, 2.0, 2.02]
    assert exact_p(slopes) == pytest.approx(0.125) and t_interval(slopes)[4] < 1e-6


def enumerated_correlation_p(x, y) -> float:
    """The two-sided permutation p of Pearson r written out: every one of the n! orders of y
    (itertools.permutations), |r*| against the observed |r| in exact rational arithmetic (the
    values are integers). The denominator sqrt(Sxx Syy) is the same for every order, so
    |r*| >= |r| is |Sxy*| >= |Sxy|, compared exactly."""
    from fractions import Fraction

    xs, ys = [Fraction(int(v)) for v in x], [Fraction(int(v)) for v in y]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    xc, yc = [v - mx for v in xs], [v - my for v in ys]
    observed = abs(sum(a * b for a, b in zip(xc, yc, strict=True)))
    orders = list(itertools.permutations(range(len(y))))
    hits = sum(abs(sum(xc[i] * yc[j] for i, j in enumerate(order))) >= observed for order in orders)
    return hits / len(orders)


@pytest.mark.parametrize("n", [5, 6])
@pytest.mark.parametrize("seed", range(4))
def test_permutation_correlation_p_is_the_exhaustive_enumeration(n, seed):
    rng = np.random.default_rng(100 * n + seed)
    # small integers: ties within x, within y and between the |r*| of different orders
    x = rng.integers(0, 3, size=n).astype(float)
    y = (x + rng.integers(-1, 2, size=n)).astype(float)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        x[0], y[-1] = x[0] + 1, y[-1] + 2
    assert permutation_correlation_p(x, y) == pytest.approx(
        enumerated_correlation_p(x, y), abs=1e-15
    )
    assert permutation_draws(n) is None  # n! <= the draws allowed: exact
    # the same p from exact_correlation_p (n <= 10), with pairs holding a NaN dropped
    assert exact_correlation_p([*x, np.nan], [*y, 1.0]) == permutation_correlation_p(x, y)


def test_permutation_correlation_p_floor_is_two_over_n_factorial():
    # n = 5, x equally spaced and y a line in x: r = +1 for the observed order and r = -1 for
    # the reversed one, and no other order reaches |r| = 1; two-sided, p = 2 / 5! = 1/60,
    # whatever the t p (which is 0) says
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    for y in (3.0 * x - 2.0, -0.5 * x + 1.0):
        assert permutation_correlation_p(x, y) == pytest.approx(2 / 120)
        assert exact_correlation_p(x, y) == pytest.approx(2 / 120)
    assert enumerated_correlation_p(x, 3.0 * x - 2.0) == pytest.approx(2 / 120)
    # x not symmetric about its mean: the reversed order is no line (|r*| < 1), so only the
    # observed order reaches |r| = 1 and the floor is 1 / 5!
    uneven = np.array([0.0, 1.0, 2.0, 4.0, 8.0])
    assert permutation_correlation_p(uneven, 3.0 * uneven) == pytest.approx(1 / 120)
    assert enumerated_correlation_p(uneven, 3.0 * uneven) == pytest.approx(1 / 120)
    assert math.isnan(permutation_correlation_p(x, np.full(5, 0.25)))  # constant: no r
    assert math.isnan(permutation_correlation_p([1.0, 2.0], [2.0, 1.0]))  # below 3 pairs


def test_permutation_correlation_p_monte_carlo_counts_the_observed_as_the_plus_one():
    rng = np.random.default_rng(10)
    x = rng.normal(size=10)
    y = 0.6 * x + rng.normal(size=10)
    # n = 10: 10! = 3628800 orders > MAX_EXACT, so B = 5000 orders drawn with seed 7
    assert permutation_draws(10, 5000) == 5000
    p = permutation_correlation_p(x, y, n_draws=5000, seed=7)
    assert p == permutation_correlation_p(x, y, n_draws=5000, seed=7)  # seeded: the same p
    assert 1 / 5001 <= p <= 1.0
    hits = p * 5001 - 1  # p = (1 + hits) / (1 + B): hits a whole number in [0, B]
    assert hits == pytest.approx(round(hits), abs=1e-9) and 0 <= round(hits) <= 5000
    # the default draws (PERMUTATION_DRAWS) and exact_correlation_p give the same Monte Carlo p
    assert exact_correlation_p(x, y) == permutation_correlation_p(x, y)
    assert permutation_draws(10) == 100_000 and permutation_draws(9) == 100_000
    # a line: only 2 of the 10! orders reach |r| = 1, so no draw does: the floor 1 / (1 + B)
    line = permutation_correlation_p(x, 2.0 * x, n_draws=1000, seed=3)
    assert line == pytest.approx(1 / 1001)
    assert format_permutation_p(line, 10, 1000) == "< 0.001"
    assert format_permutation_p(2 / 120, 5) == "0.017"  # exact: a number, no floor
    # n = 8 drawn (8! = 40320 > 20000 draws) agrees with its enumeration within Monte Carlo error
    x8, y8 = x[:8], y[:8]
    drawn = permutation_correlation_p(x8, y8, n_draws=20_000, seed=1)
    assert drawn == pytest.approx(permutation_correlation_p(x8, y8), abs=0.01)


def test_exact_correlation_p_is_nan_above_ten_pairs():
    rng = np.random.default_rng(12)
    x = rng.normal(size=11)
    y = x + rng.normal(size=11)
    assert math.isnan(exact_correlation_p(x, y))  # above 10 the t p stands alone
    assert np.isfinite(exact_correlation_p(x[:10], y[:10]))
    # 11 rows, one with a NaN: 10 complete pairs, so computed
    assert np.isfinite(exact_correlation_p([*x[:10], np.nan], y))

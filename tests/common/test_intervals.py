"""Intervals against scipy and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest
from scipy.stats import t as student_t

from repdiag.common.intervals import mean_interval, newcombe_interval, wilson_interval


@pytest.mark.parametrize(("hits", "n"), [(0, 10), (10, 10), (3, 17), (500, 1000)])
def test_wilson_interval_matches_scipy(hits: int, n: int) -> None:
    ci = binomtest(hits, n).proportion_ci(method="wilson")
    low, high = wilson_interval(hits, n)
    assert (low, high) == (pytest.approx(ci.low, abs=1e-12), pytest.approx(ci.high, abs=1e-12))
    assert low <= hits / n <= high
    low99, high99 = wilson_interval(hits, n, 0.99)
    assert low99 <= low and high <= high99  # a higher confidence level widens the interval
    assert (low99, high99) != (low, high)


@pytest.mark.parametrize(("hits", "n"), [(0.5, 1), (1 / 3, 10), (2.75, 17), (499.125, 1000)])
def test_wilson_interval_at_non_integer_hits(hits: float, n: int) -> None:
    """The bounds solve the Wilson score equation (p_hat - p)^2 = z^2 p (1 - p) / n."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    z, p_hat = norm.ppf(0.975), hits / n

    def equation(p):
        return (p_hat - p) ** 2 - z * z * p * (1 - p) / n

    low, high = wilson_interval(hits, n)
    assert low == pytest.approx(brentq(equation, 0.0, p_hat), abs=1e-10)
    assert high == pytest.approx(brentq(equation, p_hat, 1.0), abs=1e-10)
    below, above = wilson_interval(np.floor(hits), n), wilson_interval(np.ceil(hits), n)
    assert below[0] <= low <= above[0] and below[1] <= high <= above[1]
    with pytest.raises(ValueError, match="0 <= hits <= n"):
        wilson_interval(n + 0.5, n)


def test_mean_interval_is_the_student_t_interval_of_the_finite_values() -> None:
    values = np.array([1.0, 2.0, 4.0, np.nan, 7.0])
    mean, sd, low, high = mean_interval(values)
    finite = np.array([1.0, 2.0, 4.0, 7.0])
    half = student_t.ppf(0.975, 3) * finite.std(ddof=1) / 2.0
    assert (mean, sd) == (pytest.approx(3.5), pytest.approx(finite.std(ddof=1)))
    assert (low, high) == (pytest.approx(3.5 - half), pytest.approx(3.5 + half))


def test_mean_interval_is_undefined_below_two_values() -> None:
    mean, sd, low, high = mean_interval(np.array([2.0]))
    assert mean == 2.0 and all(math.isnan(v) for v in (sd, low, high))
    assert all(math.isnan(v) for v in mean_interval(np.array([])))


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # Newcombe (1998), Stat. Med. 17:873, table II, method 10 (hybrid score)
        ((56, 70), (48, 80), (0.0524, 0.3339)),
        ((9, 10), (3, 10), (0.1705, 0.8090)),
        ((5, 56), (0, 29), (-0.0381, 0.1926)),
        ((10, 10), (0, 20), (0.6791, 1.0)),
    ],
)
def test_newcombe_interval_matches_the_published_values(a, b, expected) -> None:
    low, high = newcombe_interval(*a, *b)
    assert (low, high) == pytest.approx(expected, abs=5e-5)


def test_newcombe_interval_is_antisymmetric_and_contains_the_difference() -> None:
    low, high = newcombe_interval(30, 50, 20, 60)
    flipped = newcombe_interval(20, 60, 30, 50)
    assert flipped == pytest.approx((-high, -low))
    assert low < 30 / 50 - 20 / 60 < high
    # equal proportions: the interval is symmetric about 0
    same = newcombe_interval(10, 40, 10, 40)
    assert same[0] == pytest.approx(-same[1])


def test_bootstrap_counts_are_seeded_resamples_of_every_row() -> None:
    from repdiag.common.intervals import bootstrap_counts

    counts = bootstrap_counts(7, 500, seed=[3, 6])
    assert counts.shape == (500, 7)
    np.testing.assert_array_equal(counts.sum(axis=1), 7)  # each resample draws n rows
    np.testing.assert_array_equal(counts, bootstrap_counts(7, 500, seed=[3, 6]))
    assert not np.array_equal(counts, bootstrap_counts(7, 500, seed=[4, 6]))
    # the counts are those of rows drawn with replacement from the same generator
    draws = np.random.default_rng([3, 6]).integers(0, 7, size=(500, 7))
    np.testing.assert_array_equal(counts[0], np.bincount(draws[0], minlength=7))
    assert counts.mean() == pytest.approx(1.0)  # each row once on average
    with pytest.raises(ValueError, match="n > 0"):
        bootstrap_counts(0, 10, 0)


def test_percentile_interval_is_the_quantiles_of_the_finite_draws() -> None:
    from repdiag.common.intervals import bootstrap_counts, percentile_interval

    draws = np.arange(1001, dtype=float)
    assert percentile_interval(draws) == pytest.approx((25.0, 975.0))
    assert percentile_interval(np.r_[draws, np.nan, np.inf], 0.9) == pytest.approx((50.0, 950.0))
    assert all(math.isnan(v) for v in percentile_interval(np.array([np.nan])))
    # the bootstrap interval of a mean is close to mean +- 1.96 sd / sqrt(n)
    values = np.random.default_rng(0).standard_normal(400)
    counts = bootstrap_counts(400, 4000, seed=1)
    low, high = percentile_interval(counts @ values / 400)
    half = 1.96 * values.std() / 20
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert (low + high) / 2 == pytest.approx(values.mean(), abs=0.1 * half)

"""Confidence intervals used by every study: a binomial proportion, a difference of two, a mean,
and the percentile bootstrap (resample counts and the interval of the draws)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import ndtri, stdtrit  # not scipy.stats: a second of import per job

NAN = math.nan
WILSON = "wilson"
"""The name tables record (``ci_method``) for an interval of :func:`wilson_interval`."""


def wilson_interval(hits: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927), no continuity correction.

    centre = (h + z^2/2) / (n + z^2), half-width = z / (n + z^2) * sqrt(h (n - h) / n + z^2 / 4);
    identical to ``scipy.stats.binomtest(h, n).proportion_ci(method="wilson")`` for integer
    ``h``. A float ``h`` (expected hits under tie credit) goes through the same closed form.
    """
    if n <= 0 or not 0 <= hits <= n:
        raise ValueError(f"a binomial interval needs 0 <= hits <= n and n > 0, got {hits}/{n}")
    z = float(ndtri(0.5 + confidence / 2.0))
    centre = (hits + z * z / 2.0) / (n + z * z)
    half = z / (n + z * z) * np.sqrt(hits * (n - hits) / n + z * z / 4.0)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def newcombe_interval(
    hits: float, n: int, hits_base: float, n_base: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Newcombe's hybrid score interval (1998, method 10) of p - p_base for two independent
    binomial proportions, from their Wilson intervals (l, u) and (l_b, u_b):

        [d - sqrt((p - l)^2 + (u_b - p_b)^2),  d + sqrt((u - p)^2 + (p_b - l_b)^2)],  d = p - p_b.

    For two accuracies on the same items it ignores their positive correlation, so it is wider
    than a paired interval."""
    p, p_base = hits / n if n > 0 else NAN, hits_base / n_base if n_base > 0 else NAN
    low, high = wilson_interval(hits, n, confidence)
    low_base, high_base = wilson_interval(hits_base, n_base, confidence)
    delta = p - p_base
    return (
        float(delta - math.hypot(p - low, high_base - p_base)),
        float(delta + math.hypot(high - p, p_base - low_base)),
    )


def mean_interval(
    values: np.ndarray, confidence: float = 0.95
) -> tuple[float, float, float, float]:
    """Mean, sample SD and Student-t interval mean +- t_{1-a/2, n-1} SD / sqrt(n) of the finite
    values (NaN for what n < 2 leaves undefined)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    n = len(values)
    if n == 0:
        return NAN, NAN, NAN, NAN
    mean = float(values.mean())
    if n < 2:
        return mean, NAN, NAN, NAN
    sd = float(values.std(ddof=1))
    half = float(stdtrit(n - 1, 0.5 + confidence / 2) * sd / np.sqrt(n))
    return mean, sd, mean - half, mean + half


def bootstrap_counts(n: int, n_boot: int, seed: int | Sequence[int]) -> np.ndarray:
    """``(n_boot, n)`` counts of how often each of ``n`` rows is drawn in each of ``n_boot``
    resamples with replacement (each row sums to ``n``), from ``default_rng(seed)``.

    A statistic that is a function of sums over rows, ``f(sum_r x_r)``, is bootstrapped by
    ``f(counts @ x)``: one matrix product instead of ``n_boot`` re-evaluations."""
    if n <= 0 or n_boot <= 0:
        raise ValueError(
            f"a bootstrap needs n > 0 rows and n_boot > 0 resamples, got {n}, {n_boot}"
        )
    draws = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    flat = (np.arange(n_boot)[:, None] * n + draws).ravel()
    return np.bincount(flat, minlength=n_boot * n).reshape(n_boot, n).astype(np.float64)


def percentile_interval(draws: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval: the ``(1 - c) / 2`` and ``(1 + c) / 2`` quantiles of the
    finite draws (NaN, NaN without any)."""
    draws = np.asarray(draws, dtype=float)
    draws = draws[np.isfinite(draws)]
    if draws.size == 0:
        return NAN, NAN
    low, high = np.quantile(draws, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return float(low), float(high)

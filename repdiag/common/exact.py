"""Exact and permutation tests, and the adjustment of a family of them.

- :func:`sign_flip_p`: the two-sided sign-flip p of paired differences or per-block values
  (Fisher 1935, the exact one-sample permutation test), every one of the 2^k sign assignments
  when few enough; :func:`exact_p` prints it beside a one-sample t p up to :data:`EXACT_N`
  values;
- :func:`permutation_correlation_p`: the two-sided permutation p of Pearson r over the orders
  of y (Fisher 1935; Pitman 1937), every one of the n! when few enough;
  :func:`exact_correlation_p` prints it beside Pearson's t p up to :data:`EXACT_N` pairs;
- :func:`holm`: Holm's (1979) step-down adjustment of a family of p;
- :func:`format_p`, :func:`format_permutation_p`: a p for a table, a Monte Carlo p at its floor
  printed ``< 1/B``.

Every test enumerates its cases when :func:`exhaustive` allows (the shared rule, also used by
the cluster bootstrap and the blocked permutation of :mod:`repdiag.common.replication`), else
draws B seeded ones and counts the observed statistic as the +1: p = (1 + #{T* >= T}) / (1 + B)
(Phipson and Smyth 2010), never 0.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np

NAN = math.nan
MAX_EXACT = 400_000
"""Exhaustive enumeration (bootstrap draws, blocked permutations, sign assignments, orders) up to
this many cases."""
PERMUTATION_DRAWS = 100_000
"""Seeded draws of a Monte Carlo permutation p (:func:`permutation_correlation_p`), and the most
permutations enumerated instead: with it every one of the n! orders is counted up to n = 8
(8! = 40320), drawn for n = 9 and 10."""


def exhaustive(count: int, n_draws: int) -> bool:
    """Whether a resampling scheme with ``count`` possible cases enumerates every one of them
    (exact: at most ``n_draws`` and :data:`MAX_EXACT` cases) rather than drawing ``n_draws``
    seeded ones (Monte Carlo). The bootstrap and the permutation tests share this rule."""
    return count <= min(n_draws, MAX_EXACT)


def _varies(values: np.ndarray, centred: np.ndarray) -> bool:
    """Whether the centred values are more than rounding noise: their sum of squares exceeds
    n (1e-10 max|values|)^2 (the constant-row test of
    :func:`repdiag.common.statistics.rowwise_pearson`)."""
    scale = np.maximum(np.abs(values).max(), 1e-300)
    return bool((centred * centred).sum() > len(values) * (1e-10 * scale) ** 2)


def sign_flip_p(values: Sequence[float], n_draws: int = 100_000, seed: int = 0) -> float:
    """Two-sided sign-flip p for H0 "the paired differences are symmetric about 0" (Fisher 1935;
    the exact one-sample permutation test): the share of sign assignments whose |mean| is at least
    the observed |mean|, the observed one included. Exhaustive over all 2^k assignments when
    2^k <= :data:`MAX_EXACT` and ``n_draws``, else ``n_draws`` seeded draws with
    p = (1 + #{|T*| >= |T|}) / (1 + B). Its floor is 2 / 2^k (k = 4: 0.125; k = 10: 0.002), which
    a t p can pass on normality alone. NaN values are dropped; NaN with fewer than 1 value."""
    x = np.asarray(values, float)
    x = x[np.isfinite(x)]
    k = len(x)
    if k == 0:
        return NAN
    observed = abs(float(x.mean()))
    tolerance = 1e-12 * max(1.0, float(np.abs(x).max()))
    if exhaustive(2**k, n_draws):
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=k)))
        stats = np.abs(signs @ x) / k
        return float(np.mean(stats >= observed - tolerance))
    rng = np.random.default_rng(seed)
    signs = rng.choice((1.0, -1.0), size=(n_draws, k))
    hits = int(np.sum(np.abs(signs @ x) / k >= observed - tolerance))
    return (1 + hits) / (1 + n_draws)


EXACT_N = 10
"""Up to this many per-block values a table prints the exact sign-flip p (:func:`exact_p`) beside
the t p, whose normality a handful of seeds cannot check."""


def exact_p(values: Sequence[float], max_n: int = EXACT_N) -> float:
    """The ``p_exact`` column beside a one-sample t p: :func:`sign_flip_p` of the finite values
    (every one of the 2^k sign assignments) when 2 <= k <= ``max_n``; NaN otherwise (no t p
    below 2 values; above ``max_n`` the t p stands alone)."""
    x = np.asarray(values, float)
    k = int(np.isfinite(x).sum())
    return sign_flip_p(x) if 2 <= k <= max_n else NAN


@functools.lru_cache(maxsize=4)
def _all_orders(n: int) -> np.ndarray:
    """Every one of the n! orders of ``range(n)``, one per row (read-only, cached)."""
    orders = np.array(list(itertools.permutations(range(n))), dtype=np.intp).reshape(-1, n)
    orders.setflags(write=False)
    return orders


def permutation_draws(n: int, n_draws: int = PERMUTATION_DRAWS) -> int | None:
    """The Monte Carlo draws B behind :func:`permutation_correlation_p` of ``n`` pairs, for
    :func:`format_p`; None when it enumerates all n! permutations (exact: no floor to state)."""
    return None if exhaustive(math.factorial(max(int(n), 0)), n_draws) else n_draws


def permutation_correlation_p(
    x: Sequence[float], y: Sequence[float], n_draws: int = PERMUTATION_DRAWS, seed: int = 0
) -> float:
    """Two-sided permutation p of Pearson r (Fisher 1935; Pitman 1937) for H0 "x and y are
    exchangeable against each other": the share of the orders of y whose |r*| is at least the
    observed |r| (less 1e-12, so that ties count), the observed order included. Exhaustive over
    all n! orders when n! <= :data:`MAX_EXACT` and ``n_draws`` (:func:`exhaustive`; at the
    default, n <= 8), else ``n_draws`` = B seeded orders with p = (1 + #{|r*| >= |r|}) / (1 + B)
    (print it with :func:`format_p` and :func:`permutation_draws`). Its floor is 1 / n!, and
    2 / n! (n = 5: 1/60) when x is symmetric about its mean (equally spaced, or ranks): then a
    line's observed order (r = 1) and its reversal (r = -1) both reach |r| = 1; a t p passes
    either on normality alone. Pairs with a NaN are dropped; NaN below 3 pairs or for a
    constant side. Permuting y keeps both means and sums of squares, so |r*| >= |r| is
    |sum(xc yc*)| >= |sum(xc yc)|."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = len(x)
    if n < 3:
        return NAN
    xc, yc = x - x.mean(), y - y.mean()
    if not (_varies(x, xc) and _varies(y, yc)):
        return NAN
    observed = abs(float(xc @ yc))
    tolerance = 1e-12 * math.sqrt(float(xc @ xc) * float(yc @ yc))
    if exhaustive(math.factorial(n), n_draws):
        return float(np.mean(np.abs(yc[_all_orders(n)] @ xc) >= observed - tolerance))
    orders = np.random.default_rng(seed).permuted(np.tile(np.arange(n), (n_draws, 1)), axis=1)
    hits = int(np.sum(np.abs(yc[orders] @ xc) >= observed - tolerance))
    return (1 + hits) / (1 + n_draws)


def exact_correlation_p(
    x: Sequence[float],
    y: Sequence[float],
    max_n: int = EXACT_N,
    n_draws: int = PERMUTATION_DRAWS,
    seed: int = 0,
) -> float:
    """The ``pearson_p_exact`` column beside Pearson's t p: :func:`permutation_correlation_p`
    of the complete pairs when 3 <= n <= ``max_n``; NaN otherwise (above ``max_n`` the t p
    stands alone)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = int((np.isfinite(x) & np.isfinite(y)).sum())
    return permutation_correlation_p(x, y, n_draws, seed) if 3 <= n <= max_n else NAN


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's (1979) step-down adjusted p of a family: sort the m p ascending, p_(i) times
    (m - i + 1) for i = 1..m, running maximum, capped at 1, returned in the input order. NaN
    members are left NaN and do not count toward m. Rejecting where adjusted p <= alpha controls
    the family-wise error rate at alpha."""
    p = np.asarray(p_values, float)
    adjusted = np.full(p.shape, NAN)
    finite = np.flatnonzero(np.isfinite(p))
    m = len(finite)
    order = finite[np.argsort(p[finite], kind="stable")]
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[index]))
        adjusted[index] = running
    return adjusted


def format_p(p: float, n_draws: int | None = None) -> str:
    """A p for a table: two significant digits, or ``< 1/B`` when a Monte Carlo p of ``n_draws``
    = B draws sits at its floor 1 / (1 + B) (no draw reached the observed statistic: the true p
    is below what B draws can show, not equal to the floor); ``n/a`` when undefined."""
    if not np.isfinite(float(p)):
        return "n/a"
    if n_draws and p <= (1 + 1e-9) / (1 + n_draws):
        return f"< {1 / n_draws:.2g}"
    return f"{p:.2g}"


def format_permutation_p(p: float, n: int, n_draws: float | None = None) -> str:
    """:func:`format_p` of a :func:`permutation_correlation_p` over ``n`` pairs that was allowed
    ``n_draws`` (a table's ``n_permutations``; None or NaN: :data:`PERMUTATION_DRAWS`): exact
    when it enumerated every order, else a Monte Carlo p whose floor prints as ``< 1/B``."""
    allowed = PERMUTATION_DRAWS if n_draws is None or not np.isfinite(n_draws) else int(n_draws)
    return format_p(p, permutation_draws(n, allowed))

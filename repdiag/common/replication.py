"""Statistics whose rows are training runs, seeds as blocks: intervals and tests over units.

The unit of each row is stated once (:class:`repdiag.common.units.Units`) and every primitive
here checks it first (:func:`repdiag.common.units.check_units`): two rows of one unit, or a row
without a unit or block key, are refused with :class:`repdiag.common.units.ReplicationError`,
naming the rows, so no analysis can pool them by accident.

- :func:`cluster_bootstrap` resamples units, exhaustively when few enough, else seeded Monte
  Carlo (one row per unit, so it is the bootstrap over units; Davison and Hinkley 1997, Sec.
  3.8);
- :func:`blocked_permutation` permutes the response within each block (seed), exactly when the
  permutations are few enough, else Monte Carlo with p = (1 + #{T* >= T}) / (1 + B)
  (Phipson and Smyth 2010);
- :func:`block_slopes` fits y on x within each block and puts a t-interval over the blocks'
  slopes (the block is the replicate: mean +- t_{k-1, 1-a/2} sd / sqrt(k));
  :func:`block_correlations` does the same with Pearson or Spearman r within each block;
  beside their t p, :func:`repdiag.common.exact.exact_p` is the exact sign-flip p of the
  per-block values (k <= 10);
- :func:`fixed_effects_slope` checks the slope with seed fixed effects, OLS ``y ~ x + C(block)``,
  its t p on the residual degrees of freedom n - k - 1 (a mixed model's Wald z with four seeds
  printed p = 2e-14: it ignores how few groups there are).

The exact and permutation tests beside the t p, and Holm's adjustment of a family, are in
:mod:`repdiag.common.exact`. Each result carries its unit and n (units, blocks) and a parametric
p beside its interval (:func:`describe`), so every table can state them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from repdiag.common.exact import exact_p, exhaustive
from repdiag.common.intervals import mean_interval
from repdiag.common.statistics import bootstrap_indices, rowwise_pearson
from repdiag.common.units import Units, check_units

NAN = math.nan


def describe(
    estimate: float, low: float, high: float, p: float, n: str = "", spec: str = ".3f"
) -> str:
    """``estimate [low, high], p = P (n)``: an interval with its parametric p beside it and,
    when given, its n; ``n/a`` for an undefined estimate or bound."""

    def number(value: float, fmt: str) -> str:
        return format(float(value), fmt) if np.isfinite(float(value)) else "n/a"

    suffix = f" ({n})" if n else ""
    if not np.isfinite(float(estimate)):
        return f"n/a{suffix}"
    interval = f"[{number(low, '.2f')}, {number(high, '.2f')}]"
    return f"{number(estimate, spec)} {interval}, p = {number(p, '.2g')}{suffix}"


# --------------------------------------------------------------------------- cluster bootstrap


@dataclass(frozen=True)
class BootstrapResult:
    """A statistic on all rows, its percentile interval over unit resamples and the draws."""

    estimate: float
    low: float
    high: float
    n_units: int
    draws: np.ndarray = field(repr=False)
    weights: np.ndarray = field(repr=False)
    exact: bool = False


def _unit_draws(n_units: int, n_boot: int, seed: int) -> tuple[np.ndarray, bool]:
    """Draws of unit indices: every ordered draw when n^n is small (exact), else ``n_boot``
    seeded draws (:func:`repdiag.common.statistics.bootstrap_indices`); equally likely."""
    if exhaustive(n_units**n_units, n_boot):
        return np.array(list(itertools.product(range(n_units), repeat=n_units)), dtype=int), True
    return bootstrap_indices(n_units, n_boot, seed), False


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value whose cumulative weight reaches q (the inverse of the empirical
    distribution function, numpy's ``inverted_cdf``)."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][min(np.searchsorted(cumulative, q - 1e-12), len(values) - 1)])


def cluster_bootstrap(
    statistic: Callable[[np.ndarray], float],
    units: Units,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> BootstrapResult:
    """Percentile interval of ``statistic(rows)`` when units are resampled.

    ``units`` holds one row per unit (:func:`check_units`: two rows of one unit, or a row
    without a unit or block key, are refused). ``statistic`` takes an array of row indices (a
    unit drawn twice contributes its row twice). With n units and n^n <= min(n_boot, MAX_EXACT)
    every ordered draw is enumerated with weight n^-n (the exact bootstrap distribution);
    otherwise ``n_boot`` draws from ``default_rng(seed)``. Draws whose statistic is undefined
    (NaN) are dropped.
    """
    check_units(units, "cluster_bootstrap")
    names = sorted(set(units.unit))
    rows_of = [np.flatnonzero(np.asarray(units.unit) == name) for name in names]
    estimate = float(statistic(np.arange(len(units.unit))))
    draws, exact = _unit_draws(len(names), n_boot, seed)
    values = np.array([statistic(np.concatenate([rows_of[i] for i in draw])) for draw in draws])
    weights = np.full(len(values), 1.0 / len(values))
    keep = np.isfinite(values)
    values, weights = values[keep], weights[keep]
    if values.size == 0:
        return BootstrapResult(estimate, NAN, NAN, len(names), values, weights, exact)
    alpha = 1.0 - confidence
    low = weighted_quantile(values, weights, alpha / 2)
    high = weighted_quantile(values, weights, 1 - alpha / 2)
    return BootstrapResult(estimate, low, high, len(names), values, weights, exact)


# --------------------------------------------------------------------------- blocked permutation


@dataclass(frozen=True)
class PermutationResult:
    """Pearson r over all rows and its blocked-permutation p (one-sided greater and two-sided)."""

    r: float
    p_greater: float
    p_two_sided: float
    n_permutations: int
    exact: bool


def _block_permutations(
    y: np.ndarray, blocks: np.ndarray, n_perm: int, seed: int
) -> tuple[np.ndarray, bool]:
    """Rows of y with y permuted within each block: all of them when their number passes
    :func:`repdiag.common.exact.exhaustive`, else the identity followed by ``n_perm - 1`` seeded draws."""
    groups = [np.flatnonzero(blocks == b) for b in dict.fromkeys(blocks.tolist())]
    count = math.prod(math.factorial(len(g)) for g in groups)
    exact = exhaustive(count, n_perm)
    if exact:
        orders: Iterable = itertools.product(*(itertools.permutations(g) for g in groups))
    else:
        rng = np.random.default_rng(seed)
        draws = ([rng.permutation(g) for g in groups] for _ in range(n_perm - 1))
        orders = itertools.chain([groups], draws)
    out = np.tile(y, (count if exact else n_perm, 1))
    for i, combo in enumerate(orders):
        for g, perm in zip(groups, combo, strict=True):
            out[i, g] = y[list(perm)]
    return out, exact


def blocked_permutation(
    x: Sequence[float],
    y: Sequence[float],
    units: Units,
    *,
    n_perm: int = 20000,
    seed: int = 0,
) -> PermutationResult:
    """Permutation test of Pearson r(x, y) with y permuted within blocks (seeds).

    Within-block permutation keeps each block's values, so the pooled means and variances are
    fixed and r orders the permutations as sum(x y) does: the test asks whether x and y go
    together within blocks. Exact (every permutation, p = #{r* >= r} / N) when N = prod n_b! is
    at most ``n_perm``; else p = (1 + #{r* >= r}) / (1 + B) over B = ``n_perm - 1`` seeded
    draws, the identity counting as the 1 (Phipson and Smyth 2010): in both cases the share of
    the rows of :func:`_block_permutations` at least as extreme as the observed one. On ranks
    the same test is Spearman's. ``units`` gives each row's unit and block (the seed), one row
    per unit (:func:`check_units`). Print a Monte Carlo p with
    :func:`repdiag.common.exact.format_p`.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    blocks = np.asarray(check_units(units, "blocked_permutation", len(x)).block)
    r = float(rowwise_pearson(x, y))
    if not np.isfinite(r):
        return PermutationResult(NAN, NAN, NAN, 0, False)
    perms, exact = _block_permutations(y, blocks, n_perm, seed)
    rs = rowwise_pearson(x[None], perms)
    tol = 1e-12 * max(1.0, abs(r))
    p_greater = float(np.mean(rs >= r - tol))
    p_two_sided = float(np.mean(np.abs(rs) >= abs(r) - tol))
    return PermutationResult(r, p_greater, p_two_sided, len(rs) - (not exact), exact)


# --------------------------------------------------------------------------- per block


@dataclass(frozen=True)
class BlockEstimates:
    """A statistic of (x, y) in each block (a slope, a correlation), and the t-interval of its
    mean over blocks with the one-sample t p (H0: mean 0)."""

    values: dict[str, float]
    mean: float = NAN
    se: float = NAN
    low: float = NAN
    high: float = NAN
    p: float = NAN
    n_blocks: int = 0
    n_rows: int = 0
    note: str = ""

    @property
    def slopes(self) -> dict[str, float]:
        """The per-block values under the name :func:`block_slopes` gives them."""
        return self.values

    @property
    def p_exact(self) -> float:
        """The exact sign-flip p of the per-block values, to print beside the t p
        (:func:`repdiag.common.exact.exact_p`: NaN above
        :data:`repdiag.common.exact.EXACT_N` blocks)."""
        return exact_p(list(self.values.values()))


BlockSlopes = BlockEstimates
"""The result of :func:`block_slopes` (a slope per block)."""


def slope(x: np.ndarray, y: np.ndarray) -> float:
    """OLS slope sum((x - mx)(y - my)) / sum((x - mx)^2); NaN when x is constant."""
    xc = x - x.mean()
    ss = float(xc @ xc)
    return float(xc @ (y - y.mean()) / ss) if ss > 1e-300 else NAN


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, ...]:
    """Mean, standard error, t-interval and two-sided one-sample t p (H0: mean 0) of the finite
    values: mean +- t_{k-1, 1-a/2} sd / sqrt(k) (:func:`repdiag.common.intervals.mean_interval`),
    t = mean / (sd / sqrt(k)) on k - 1 df."""
    from scipy.special import stdtr

    mean, sd, low, high = mean_interval(np.asarray(values, float), confidence)
    k = int(np.isfinite(np.asarray(values, float)).sum())
    if k < 2:
        return (mean, NAN, NAN, NAN, NAN)
    se = sd / math.sqrt(k)
    if se == 0.0:
        return (mean, 0.0, mean, mean, 0.0 if mean else 1.0)
    return (mean, se, low, high, float(2 * stdtr(k - 1, -abs(mean / se))))


def per_block(
    x: Sequence[float],
    y: Sequence[float],
    units: Units,
    statistic: Callable[[np.ndarray, np.ndarray], float],
    *,
    what: str = "per_block",
    label: str = "statistic",
    needs: str = "",
    confidence: float = 0.95,
) -> BlockEstimates:
    """``statistic(x_b, y_b)`` over the complete rows of each block b, then the t-interval of
    the mean over blocks (:func:`t_interval`; the block is the replicate). ``units`` gives
    each row's unit and block, one row per unit (:func:`check_units`, as ``what``). Blocks
    whose statistic is undefined (NaN) are left out and named in ``note`` (``needs`` says why)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    blocks = np.asarray(check_units(units, what, len(x)).block)
    keep = np.isfinite(x) & np.isfinite(y)
    values = {}
    for b in dict.fromkeys(blocks.tolist()):
        rows = keep & (blocks == b)
        value = statistic(x[rows], y[rows]) if rows.sum() >= 2 else NAN
        if np.isfinite(value):
            values[b] = float(value)
    dropped = sorted(set(blocks.tolist()) - set(values))
    notes = [f"blocks without a {label} ({needs}): {dropped}" if dropped else ""]
    if len(values) < 2:
        notes.append("fewer than 2 blocks: no interval over blocks")
    mean, se, low, high, p = t_interval(list(values.values()), confidence)
    note = "; ".join(n for n in notes if n)
    return BlockEstimates(values, mean, se, low, high, p, len(values), int(keep.sum()), note)


def block_slopes(
    x: Sequence[float], y: Sequence[float], units: Units, *, confidence: float = 0.95
) -> BlockEstimates:
    """Per block (seed), the least-squares slope of y on x over its rows (:func:`slope`); then
    the t-interval over blocks. A block needs two distinct x values. One row per unit
    (:func:`check_units`)."""
    return per_block(
        x,
        y,
        units,
        slope,
        what="block_slopes",
        label="slope",
        needs="fewer than 2 distinct x",
        confidence=confidence,
    )


def _block_r(x: np.ndarray, y: np.ndarray, method: str) -> float:
    """Pearson r of one block, on ranks for Spearman; NaN below 3 rows or for a constant side."""
    if len(x) < 3:
        return NAN
    if method == "spearman":
        x, y = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    return float(rowwise_pearson(x, y))


def block_correlations(
    x: Sequence[float],
    y: Sequence[float],
    units: Units,
    *,
    method: str = "spearman",
    confidence: float = 0.95,
) -> BlockEstimates:
    """Per block (seed), Pearson or Spearman r of x and y over its rows (Spearman: Pearson r of
    the mid-ranks within the block, as ``scipy.stats.spearmanr``); then the t-interval of the
    mean r over blocks and its one-sample t p. A block needs 3 rows and both sides varying.
    One row per unit (:func:`check_units`)."""
    if method not in ("pearson", "spearman"):
        raise ValueError(f"unknown correlation method {method!r}; use pearson or spearman")
    return per_block(
        x,
        y,
        units,
        lambda a, b: _block_r(a, b, method),
        what="block_correlations",
        label=f"{method} r",
        needs="fewer than 3 rows or a constant side",
        confidence=confidence,
    )


# --------------------------------------------------------------------------- seed fixed effects


@dataclass(frozen=True)
class FixedEffectsSlope:
    """The slope of ``y ~ x + C(block)`` (OLS with one intercept per block, the seed fixed
    effects), its t-interval and two-sided t p on the residual degrees of freedom ``df`` =
    n - k - 1 (n rows, k blocks)."""

    slope: float = NAN
    se: float = NAN
    low: float = NAN
    high: float = NAN
    p: float = NAN
    df: int = 0
    n_rows: int = 0
    n_blocks: int = 0
    note: str = ""


def fixed_effects_slope(
    x: Sequence[float], y: Sequence[float], units: Units, *, confidence: float = 0.95
) -> FixedEffectsSlope:
    """OLS of ``y ~ x + C(block)`` over the complete rows: the within-block slope
    b = sum(xw yw) / sum(xw^2) (xw, yw: deviations from each block's mean, Frisch-Waugh-Lovell),
    se = sqrt(RSS / df / sum(xw^2)), t = b / se on df = n - k - 1, interval
    b +- t_{df, 1-a/2} se. A check beside :func:`block_slopes` that respects the number of
    blocks (each costs a degree of freedom) instead of a mixed model's Wald z, which with four
    seeds treats the slope as known. One row per unit (:func:`check_units`)."""
    from scipy.special import stdtr, stdtrit

    x, y = np.asarray(x, float), np.asarray(y, float)
    blocks = np.asarray(check_units(units, "fixed_effects_slope", len(x)).block)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y, blocks = x[keep], y[keep], blocks[keep]
    n, k = len(x), len(set(blocks.tolist()))
    df = n - k - 1
    if df < 1:
        return FixedEffectsSlope(
            df=max(df, 0),
            n_rows=n,
            n_blocks=k,
            note=f"too few rows for the seed fixed-effects fit: {n} rows, {k} blocks, "
            f"residual df {df} < 1",
        )
    frame = pd.DataFrame({"x": x, "y": y, "block": blocks})
    within = frame[["x", "y"]] - frame.groupby("block")[["x", "y"]].transform("mean")
    xw, yw = within["x"].to_numpy(), within["y"].to_numpy()
    sxx = float(xw @ xw)
    if sxx <= _tiny(x):
        return FixedEffectsSlope(
            df=df, n_rows=n, n_blocks=k, note="x does not vary within any block: no slope"
        )
    b = float(xw @ yw) / sxx
    residual = yw - b * xw
    se = math.sqrt(float(residual @ residual) / df / sxx)
    if se == 0.0:
        p = 0.0 if b else 1.0
        return FixedEffectsSlope(b, 0.0, b, b, p, df, n, k)
    half = float(stdtrit(df, 1 - (1 - confidence) / 2)) * se
    p = float(2 * stdtr(df, -abs(b / se)))
    return FixedEffectsSlope(b, se, b - half, b + half, p, df, n, k)


def _tiny(x: np.ndarray) -> float:
    """A sum of squares below which deviations are rounding noise."""
    return len(x) * (1e-10 * max(float(np.abs(x).max()), 1e-300)) ** 2

"""The unit of replication: statistics whose rows are training runs, seeds as blocks.

A network measured twice is one observation, and checkpoints of one run are not independent of
its final network. Every study states its unit once (:class:`Units`: which run each row is, the
block, usually the seed, it belongs to, and the row's name for messages) and takes its
intervals and tests from here. Every primitive takes the :class:`Units` of its rows and checks
them first (:func:`check_units`, the one check): a call in which two rows are one unit, or a row
has no unit or block key (NaN, None, ``"nan"``: a run whose seed was not recorded), is refused
with :class:`ReplicationError`, naming the rows, so no analysis can pool them by accident:

- :func:`require_independent` refuses an analysis in which two rows are one unit (checkpoints
  pooled with their run, a network listed twice), naming the rows;
- :func:`cluster_bootstrap` resamples units, exhaustively when few enough, else seeded Monte
  Carlo (one row per unit, so it is the bootstrap over units; Davison and Hinkley 1997, Sec.
  3.8);
- :func:`blocked_permutation` permutes the response within each block (seed), exactly when the
  permutations are few enough, else Monte Carlo with p = (1 + #{T* >= T}) / (1 + B)
  (Phipson and Smyth 2010);
- :func:`block_slopes` fits y on x within each block and puts a t-interval over the blocks'
  slopes (the block is the replicate: mean +- t_{k-1, 1-a/2} sd / sqrt(k));
  :func:`block_correlations` does the same with Pearson or Spearman r within each block;
  beside their t p, :func:`exact_p` is the exact sign-flip p of the per-block values (k <= 10);
- beside Pearson's t p, :func:`exact_correlation_p` is the permutation p of r over the orders of
  y (:func:`permutation_correlation_p`: every one of the n! when few enough, n <= 10);
- :func:`fixed_effects_slope` checks the slope with seed fixed effects, OLS ``y ~ x + C(block)``,
  its t p on the residual degrees of freedom n - k - 1 (a mixed model's Wald z with four seeds
  printed p = 2e-14: it ignores how few groups there are).

Each result carries its unit and n (units, blocks) and a parametric p beside its interval
(:func:`describe`), so every table can state them.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from repdiag.common.intervals import mean_interval
from repdiag.common.statistics import PERMUTATION_DRAWS, bootstrap_indices, rowwise_pearson
from repdiag.core.errors import ConfigError

NAN = math.nan
MAX_EXACT = 400_000
"""Exhaustive enumeration (bootstrap draws or blocked permutations) up to this many cases."""


class ReplicationError(ConfigError):
    """An analysis whose rows are not independent units."""


MISSING_KEYS = frozenset({"", "nan", "none", "null", "<na>", "nat", "n/a"})
"""Unit or block keys that say the key is missing (as ``str`` writes NaN, None, pd.NA, NaT)."""


def missing_key(key: object) -> bool:
    """Whether a unit or block key is missing: None, a float NaN, or a text of
    :data:`MISSING_KEYS` (any case, spaces stripped)."""
    if key is None or (isinstance(key, float) and math.isnan(key)):
        return True
    return str(key).strip().lower() in MISSING_KEYS


@dataclass(frozen=True)
class Units:
    """The unit of each row of an analysis: ``unit[i]`` names the training run row i belongs
    to, ``block[i]`` its block (the seed); ``name`` says what a unit is (``training run``,
    ``objective``) for the tables; ``rows`` names the rows (the models) in the messages of
    :func:`check_units` (``row <i>`` when empty)."""

    unit: tuple[str, ...]
    block: tuple[str, ...]
    name: str = "training run"
    rows: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.block) != len(self.unit) or (self.rows and len(self.rows) != len(self.unit)):
            raise ReplicationError(
                f"Units: {len(self.unit)} unit keys, {len(self.block)} block keys and "
                f"{len(self.rows)} row names; give one of each per row"
            )

    @classmethod
    def of(
        cls,
        table: pd.DataFrame,
        unit: str,
        block: str | None = None,
        name: str = "training run",
        rows: str | None = None,
    ) -> Units:
        """Units from a table's columns (``block`` None: every row in one block ``all``;
        ``rows`` None: rows named by the table's index)."""
        missing = [c for c in (unit, block, rows) if c is not None and c not in table.columns]
        if missing:
            raise ConfigError(
                f"the table has no unit column(s) {missing}; available: {list(table.columns)}"
            )
        units = tuple(str(v) for v in table[unit])
        blocks = tuple(str(v) for v in table[block]) if block else ("all",) * len(units)
        names = table[rows] if rows else [f"row {i}" for i in table.index]
        return cls(units, blocks, name, tuple(str(v) for v in names))

    @property
    def n_units(self) -> int:
        return len(set(self.unit))

    @property
    def n_blocks(self) -> int:
        return len(set(self.block))

    @property
    def row_names(self) -> tuple[str, ...]:
        return self.rows or tuple(f"row {i}" for i in range(len(self.unit)))

    def take(self, rows: Sequence[int] | np.ndarray) -> Units:
        """The units of a subset of the rows (integer positions or a boolean mask)."""
        index = np.arange(len(self.unit))[np.asarray(rows)]
        pick = [int(i) for i in index]
        names = tuple(self.rows[i] for i in pick) if self.rows else tuple(f"row {i}" for i in pick)
        return Units(
            tuple(self.unit[i] for i in pick), tuple(self.block[i] for i in pick), self.name, names
        )


def check_units(
    units: Units, what: str, n_rows: int | None = None, *, one_row_per_unit: bool = True
) -> Units:
    """The check every primitive makes before it computes anything: ``units`` is a
    :class:`Units` of ``n_rows`` rows, every row has a unit and a block key (not NaN, None or
    ``"nan"``: :func:`missing_key`), and, with ``one_row_per_unit``, no two rows are one unit.
    Refuses ``what`` with :class:`ReplicationError` naming the rows, and says what to do;
    returns ``units``. ``one_row_per_unit=False`` is for tables that hold a run's checkpoints
    as a trajectory (shown, not tested): their keys are checked, not their number."""
    if not isinstance(units, Units):
        raise ReplicationError(
            f"{what}: takes the Units of its rows (repdiag.common.replication.Units: the unit "
            f"and the block of each row), not {type(units).__name__}; build them with Units.of"
        )
    if n_rows is not None and len(units.unit) != n_rows:
        raise ReplicationError(
            f"{what}: {len(units.unit)} units for {n_rows} rows; give the unit of every row"
        )
    names = units.row_names
    unkeyed = [
        f"{row} (unit {unit!r}, block {block!r})"
        for row, unit, block in zip(names, units.unit, units.block, strict=True)
        if missing_key(unit) or missing_key(block)
    ]
    if unkeyed:
        raise ReplicationError(
            f"{what}: rows without a {units.name} or block key (NaN or None): "
            f"{'; '.join(unkeyed)}. Record the run and seed of every row (a run whose seed is "
            "NaN belongs to no block and would be keyed 'nan'), or leave those rows out"
        )
    if not one_row_per_unit:
        return units
    shared: dict[str, list[str]] = {}
    for row, unit in zip(names, units.unit, strict=True):
        shared.setdefault(unit, []).append(str(row))
    repeated = {unit: rows for unit, rows in shared.items() if len(rows) > 1}
    if repeated:
        listed = "; ".join(f"{unit}: {', '.join(rows)}" for unit, rows in repeated.items())
        raise ReplicationError(
            f"{what}: rows are not independent units ({units.name}): {listed}. Keep one row per "
            f"{units.name} (the final checkpoint of a run; the mean over the seeds of an "
            "objective) and analyse checkpoints apart as trajectories"
        )
    return units


def require_independent(units: Units, rows: Sequence[str], what: str) -> None:
    """Refuse ``what`` when two of its rows (named by ``rows``) are the same unit, or a row has
    no unit or block key (:func:`check_units`): an analysis that treats checkpoints of one run
    (or one network listed twice) as independent points."""
    names = tuple(str(row) for row in rows)
    if len(names) != len(units.unit):
        raise ReplicationError(f"{what}: {len(names)} row names for {len(units.unit)} units")
    check_units(Units(units.unit, units.block, units.name, names), what)


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


def _exhaustive(count: int, n_draws: int) -> bool:
    """Whether a resampling scheme with ``count`` possible cases enumerates every one of them
    (exact: at most ``n_draws`` and :data:`MAX_EXACT` cases) rather than drawing ``n_draws``
    seeded ones (Monte Carlo). The bootstrap and the permutation test share this rule."""
    return count <= min(n_draws, MAX_EXACT)


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
    if _exhaustive(n_units**n_units, n_boot):
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
    :func:`_exhaustive`, else the identity followed by ``n_perm - 1`` seeded draws."""
    groups = [np.flatnonzero(blocks == b) for b in dict.fromkeys(blocks.tolist())]
    count = math.prod(math.factorial(len(g)) for g in groups)
    exact = _exhaustive(count, n_perm)
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
    per unit (:func:`check_units`). Print a Monte Carlo p with :func:`format_p`.
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
        (:func:`exact_p`: NaN above :data:`EXACT_N` blocks)."""
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


# --------------------------------------------------------------------------- exact tests, families


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
    if _exhaustive(2**k, n_draws):
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
    return None if _exhaustive(math.factorial(max(int(n), 0)), n_draws) else n_draws


def permutation_correlation_p(
    x: Sequence[float], y: Sequence[float], n_draws: int = PERMUTATION_DRAWS, seed: int = 0
) -> float:
    """Two-sided permutation p of Pearson r (Fisher 1935; Pitman 1937) for H0 "x and y are
    exchangeable against each other": the share of the orders of y whose |r*| is at least the
    observed |r| (less 1e-12, so that ties count), the observed order included. Exhaustive over
    all n! orders when n! <= :data:`MAX_EXACT` and ``n_draws`` (:func:`_exhaustive`; at the
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
    if n < 3 or not np.isfinite(float(rowwise_pearson(x, y))):
        return NAN
    xc, yc = x - x.mean(), y - y.mean()
    observed = abs(float(xc @ yc))
    tolerance = 1e-12 * math.sqrt(float(xc @ xc) * float(yc @ yc))
    if _exhaustive(math.factorial(n), n_draws):
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

"""Statistics across models: correlations with bootstrap intervals, partial correlation.

Every function works on a table with one row per model (``results/tables/models.csv`` and the
studies' own tables). The binding paper (Chung and Kim 2026, Sec. 5) reports Pearson r with
p-values over its 26 encoders, a bivariate OLS ``binding ~ JER + same_different`` (R^2 = 0.78), and
a partial correlation that controls for zero-shot accuracy; this module computes the
correlations with scipy (the OLS with statsmodels in :mod:`repdiag.common.ols`). Intervals
resample *models* (rows) with replacement, seeded, and take percentiles.

These assume one independent unit per row. Where rows are training runs with seeds as blocks
and checkpoints nested in runs, the unit is stated in :mod:`repdiag.common.units` and the
statistics over it are in :mod:`repdiag.common.replication` (cluster bootstrap over runs,
seed-blocked permutation test, per-seed slopes with a t-interval over seeds, the seed
fixed-effects check), which refuses pooled rows. :func:`correlation` and
:func:`correlation_table` take the rows' ``units`` too and make the same check
(:func:`repdiag.common.units.check_units`) before computing anything.

With fewer rows than ``min_models`` (or than a statistic needs) a function returns NaN values and
a ``note`` saying why, never an exception: a run with three models still writes its tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from repdiag.common.exact import PERMUTATION_DRAWS, exact_correlation_p
from repdiag.common.units import Units, check_units
from repdiag.core.errors import ConfigError


def _scipy_stats():
    """scipy.stats, imported on first use: it costs about a second of every job's start-up, and
    plotting and table jobs that only format numbers never need it."""
    from scipy import stats

    return stats


NAN = float("nan")
DEFAULT_MIN_MODELS = 4
"""The fewest models a statistic is computed on unless told otherwise (``stats.min_models``'s
default in the schema, tested)."""


def too_few_note(n: int, needed: int, what: str) -> str:
    return (
        f"too few models for {what}: {n} < {needed}; add models to config.models "
        f"(or lower stats.min_models) to compute it"
    )


def complete_rows(*columns: np.ndarray) -> np.ndarray:
    """Boolean mask of rows where every column is finite (pairwise-complete analysis)."""
    mask = np.ones(len(columns[0]), dtype=bool)
    for column in columns:
        values = np.asarray(column, dtype=float)
        if len(values):  # no rows (a model set without members): nothing to mask
            mask &= np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    return mask


# --------------------------------------------------------------------------- correlations


def rowwise_pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair: sum(xc yc) / sqrt(sum xc^2 sum yc^2) over the last axis; NaN
    for a constant row. x and y broadcast (one x against every row of y); two vectors give a
    0-d array."""
    xc = x - x.mean(axis=-1, keepdims=True)
    yc = y - y.mean(axis=-1, keepdims=True)
    ssx, ssy = (xc * xc).sum(axis=-1), (yc * yc).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.clip((xc * yc).sum(axis=-1) / np.sqrt(ssx * ssy), -1.0, 1.0)
    return np.where((ssx <= _round_off(x)) | (ssy <= _round_off(y)), NAN, r)


def _round_off(values: np.ndarray) -> np.ndarray:
    """Sum of squares below which centred values are rounding noise (a constant row)."""
    scale = np.abs(values).max(axis=-1)
    return values.shape[-1] * (1e-10 * np.maximum(scale, 1e-300)) ** 2


def bootstrap_indices(n: int, n_boot: int, seed: int) -> np.ndarray:
    """``(n_boot, n)`` row indices drawn with replacement from ``default_rng(seed)``."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def bootstrap_correlation_ci(
    x: np.ndarray,
    y: np.ndarray,
    *,
    method: str = "pearson",
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, int]:
    """Percentile bootstrap interval of Pearson or Spearman r, resampling models (rows).

    Resamples in which either variable is constant have no correlation and are skipped; the
    third value returned is how many resamples were usable.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    idx = bootstrap_indices(len(x), n_boot, seed)
    xs, ys = x[idx], y[idx]
    if method == "spearman":
        xs, ys = _scipy_stats().rankdata(xs, axis=1), _scipy_stats().rankdata(ys, axis=1)
    elif method != "pearson":
        raise ValueError(f"unknown correlation method {method!r}; use pearson or spearman")
    r = rowwise_pearson(xs, ys)
    valid = r[np.isfinite(r)]
    if valid.size == 0:
        return NAN, NAN, 0
    alpha = 1.0 - confidence
    low, high = np.quantile(valid, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high), int(valid.size)


@dataclass(frozen=True)
class Correlation:
    """Pearson and Spearman correlation of two columns with p-values and bootstrap intervals;
    beside Pearson's t p, up to 10 rows, the permutation p of r (``pearson_p_exact``)."""

    n: int
    pearson_r: float = NAN
    pearson_p: float = NAN
    pearson_p_exact: float = NAN
    pearson_ci_low: float = NAN
    pearson_ci_high: float = NAN
    spearman_rho: float = NAN
    spearman_p: float = NAN
    spearman_ci_low: float = NAN
    spearman_ci_high: float = NAN
    n_boot_valid: int = 0
    note: str = ""


def is_constant(values: np.ndarray) -> bool:
    values = np.asarray(values, dtype=float)
    return len(values) == 0 or bool(((values - values.mean()) ** 2).sum() <= _round_off(values))


def pearson(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, int]:
    """Pearson r and two-sided p (scipy) on the complete rows; NaN when undefined."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    mask = complete_rows(x, y)
    x, y = x[mask], y[mask]
    if len(x) < 3 or is_constant(x) or is_constant(y):
        return NAN, NAN, len(x)
    result = _scipy_stats().pearsonr(x, y)
    return float(result.statistic), float(result.pvalue), len(x)


def correlation(
    x: Sequence[float],
    y: Sequence[float],
    *,
    units: Units | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    min_models: int = DEFAULT_MIN_MODELS,
    n_perm: int = PERMUTATION_DRAWS,
) -> Correlation:
    """Pearson r (scipy ``pearsonr``) and Spearman rho (``spearmanr``) with bootstrap intervals.

    Rows where either value is missing are dropped. With fewer than ``min_models`` rows, or a
    constant column, every statistic is NaN and ``note`` says why. ``units``, the unit of each
    row, refuses two rows of one unit and a row without a unit key, naming them
    (:func:`repdiag.common.units.check_units`); every caller in repdiag passes them.
    Up to :data:`repdiag.common.exact.EXACT_N` (10) rows, ``pearson_p_exact`` is the
    two-sided permutation p of r beside the t p
    (:func:`repdiag.common.exact.exact_correlation_p`: every one of the n! orders of y
    when n! <= ``n_perm``, else ``n_perm`` orders drawn with ``seed``); NaN above.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if units is not None:
        check_units(units, "correlation", len(x))
    mask = complete_rows(x, y)
    x, y = x[mask], y[mask]
    n = len(x)
    needed = max(min_models, 3)
    if n < needed:
        return Correlation(n=n, note=too_few_note(n, needed, "a correlation"))
    constant = [name for name, v in (("metric", x), ("target", y)) if is_constant(v)]
    if constant:
        return Correlation(
            n=n, note=f"{' and '.join(constant)} constant across models: correlation undefined"
        )
    p = _scipy_stats().pearsonr(x, y)
    s = _scipy_stats().spearmanr(x, y)
    p_low, p_high, valid = bootstrap_correlation_ci(
        x, y, method="pearson", n_boot=n_boot, seed=seed, confidence=confidence
    )
    s_low, s_high, _ = bootstrap_correlation_ci(
        x, y, method="spearman", n_boot=n_boot, seed=seed, confidence=confidence
    )
    note = "" if valid == n_boot else f"{n_boot - valid} of {n_boot} resamples constant, skipped"
    return Correlation(
        n=n,
        pearson_r=float(p.statistic),
        pearson_p=float(p.pvalue),
        pearson_p_exact=exact_correlation_p(x, y, n_draws=n_perm, seed=seed),
        pearson_ci_low=p_low,
        pearson_ci_high=p_high,
        spearman_rho=float(s.statistic),
        spearman_p=float(s.pvalue),
        spearman_ci_low=s_low,
        spearman_ci_high=s_high,
        n_boot_valid=valid,
        note=note,
    )


def correlation_table(
    table: pd.DataFrame,
    target: str,
    metrics: Sequence[str],
    *,
    units: Units | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    min_models: int = DEFAULT_MIN_MODELS,
    n_perm: int = PERMUTATION_DRAWS,
) -> pd.DataFrame:
    """One row per metric: its correlation with ``target`` over the models of ``table``, whose
    rows are ``units`` (checked by :func:`correlation`). ``n_bootstrap`` and ``n_permutations``
    state the resamples and the permutation draws allowed (``pearson_p_exact`` enumerates every
    order of n rows when n! <= ``n_permutations``:
    :func:`repdiag.common.exact.permutation_draws`)."""
    require_columns(table, [target, *metrics], "the models table")
    rows = []
    for metric in metrics:
        result = correlation(
            table[metric].to_numpy(float),
            table[target].to_numpy(float),
            units=units,
            n_boot=n_boot,
            seed=seed,
            confidence=confidence,
            min_models=min_models,
            n_perm=n_perm,
        )
        rows.append({"metric": metric, "target": target, **asdict(result)})
    frame = pd.DataFrame(rows, columns=["metric", "target", *Correlation.__dataclass_fields__])
    frame["confidence"] = confidence
    frame["n_bootstrap"] = n_boot
    frame["n_permutations"] = n_perm
    return frame


def require_columns(table: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ConfigError(
            f"{what} has no column(s) {missing}; available: {', '.join(map(str, table.columns))}"
        )


# --------------------------------------------------------------------------- partial correlation


def residualise(values: np.ndarray, covariates: np.ndarray) -> np.ndarray:
    """Residuals of least squares ``values ~ 1 + covariates`` (numpy lstsq)."""
    design = np.column_stack([np.ones(len(values)), covariates])
    coef, *_ = np.linalg.lstsq(design, values, rcond=None)
    return values - design @ coef


def partial_correlation_value(x: np.ndarray, y: np.ndarray, covariates: np.ndarray) -> float:
    """Residual-on-residual r: Pearson r of (x | Z) and (y | Z) residuals."""
    rx, ry = residualise(x, covariates), residualise(y, covariates)
    return float(rowwise_pearson(rx[None], ry[None])[0])


@dataclass(frozen=True)
class PartialCorrelation:
    n: int
    dof: int = 0
    r: float = NAN
    p: float = NAN
    ci_low: float = NAN
    ci_high: float = NAN
    zero_order_r: float = NAN
    n_boot_valid: int = 0
    note: str = ""


def partial_correlation(
    x: Sequence[float],
    y: Sequence[float],
    covariates: np.ndarray,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    min_models: int = DEFAULT_MIN_MODELS,
) -> PartialCorrelation:
    """Partial correlation of x and y given the columns of ``covariates`` (n, k).

    r = corr(x - P_Z x, y - P_Z y) with P_Z the projection on [1, Z]; p from
    t = r sqrt(dof / (1 - r^2)) on dof = n - 2 - k degrees of freedom (as in ``pingouin.partial_corr``);
    the interval resamples models.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    z = np.asarray(covariates, dtype=float).reshape(len(x), -1)
    mask = complete_rows(x, y, z)
    x, y, z = x[mask], y[mask], z[mask]
    n, k = len(x), z.shape[1]
    dof = n - 2 - k
    needed = max(min_models, k + 4)
    if n < needed:
        return PartialCorrelation(
            n=n, dof=max(dof, 0), note=too_few_note(n, needed, "a partial correlation")
        )
    r = partial_correlation_value(x, y, z)
    if not np.isfinite(r):
        return PartialCorrelation(
            n=n, dof=dof, note="a residual is constant (covariate explains x or y exactly)"
        )
    t = r * np.sqrt(dof / max(1.0 - r * r, 1e-300))
    p = float(2 * _scipy_stats().t.sf(abs(t), dof))
    boot = np.array(
        [
            partial_correlation_value(x[i], y[i], z[i])
            if np.linalg.matrix_rank(np.column_stack([np.ones(n), z[i]])) == k + 1
            else NAN
            for i in bootstrap_indices(n, n_boot, seed)
        ]
    )
    valid = boot[np.isfinite(boot)]
    alpha = 1.0 - confidence
    low, high = np.quantile(valid, [alpha / 2, 1 - alpha / 2]) if valid.size else (NAN, NAN)
    return PartialCorrelation(
        n=n,
        dof=dof,
        r=r,
        p=p,
        ci_low=float(low),
        ci_high=float(high),
        zero_order_r=pearson(x, y)[0],
        n_boot_valid=int(valid.size),
    )


def partial_table(
    table: pd.DataFrame,
    x: str,
    y: str,
    control_sets: Sequence[Sequence[str]],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    min_models: int = DEFAULT_MIN_MODELS,
    empty_note: str = "no covariate to control for",
) -> pd.DataFrame:
    """One row per control set: partial correlation of ``x`` with ``y`` given those columns."""
    columns = ["x", "y", "controls", *PartialCorrelation.__dataclass_fields__]
    rows = []
    for controls in control_sets:
        require_columns(table, [x, y, *controls], "the models table")
        result = partial_correlation(
            table[x].to_numpy(float),
            table[y].to_numpy(float),
            table[list(controls)].to_numpy(float),
            n_boot=n_boot,
            seed=seed,
            confidence=confidence,
            min_models=min_models,
        )
        rows.append({"x": x, "y": y, "controls": " + ".join(controls), **asdict(result)})
    if not rows:
        rows.append({"x": x, "y": y, "controls": "", "n": len(table), "note": empty_note})
    return pd.DataFrame(rows, columns=columns)

"""The between/within split of a slope over training runs nested in groups (objectives).

For run j of group i (an objective's seeds), Mundlak's (1978) random-intercept model

    y_ij = a + b_B xbar_i + b_W (x_ij - xbar_i) + u_i + e_ij,   u_i ~ N(0, s_u^2), e ~ N(0, s^2)

separates the slope across groups, b_B (how the objectives' mean x and mean y go together: the
paper's comparison across encoders), from the slope within a group, b_W (how seeds of one
objective that land at higher x land at higher y: training's noise, not the objective). A pooled
correlation over runs mixes the two and counts each seed as a unit. Reported
(:func:`between_within`):

* ``between``: OLS of the group means ybar_i on xbar_i, one point per group however many runs
  it has, with its t interval and p on k - 2 degrees of freedom (k groups);
* ``within``: the fixed-effects slope (:func:`repdiag.common.replication.fixed_effects_slope`:
  one intercept per group), t on n - k - 1 degrees of freedom;
* ``mixed_between``, ``mixed_within``, ``group_sd``, ``residual_sd``: the same model fitted by
  REML (statsmodels ``MixedLM``), whose b_W equals the within slope and, for groups of equal
  size, b_B the between slope (tested); its Wald intervals are not reported, as with few groups
  they treat the variance of u as known.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from repdiag.common.replication import fixed_effects_slope
from repdiag.common.units import Units, check_units

NAN = math.nan


@dataclass(frozen=True)
class BetweenWithin:
    """:func:`between_within`'s estimates (module doc), with the numbers behind them."""

    between: float = NAN
    between_low: float = NAN
    between_high: float = NAN
    between_p: float = NAN
    between_df: int = 0
    within: float = NAN
    within_low: float = NAN
    within_high: float = NAN
    within_p: float = NAN
    within_df: int = 0
    mixed_between: float = NAN
    mixed_within: float = NAN
    group_sd: float = NAN
    residual_sd: float = NAN
    n_rows: int = 0
    n_groups: int = 0
    note: str = ""


@dataclass(frozen=True)
class Line:
    """:func:`line_fit`'s OLS line ``y = intercept + slope x`` with t intervals on n - 2 df."""

    slope: float = NAN
    slope_low: float = NAN
    slope_high: float = NAN
    slope_p: float = NAN
    intercept: float = NAN
    intercept_low: float = NAN
    intercept_high: float = NAN
    intercept_p: float = NAN
    df: int = 0


def line_fit(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> Line:
    """OLS of ``y`` on ``x`` with an intercept: each coefficient with its t interval and two-sided
    p on n - 2 degrees of freedom (NaN below 3 points or for a constant x)."""
    from scipy.special import stdtr, stdtrit

    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    xc = x - x.mean() if n else x
    sxx = float(xc @ xc)
    if n < 3 or sxx == 0.0:
        return Line(df=max(n - 2, 0))
    b = float(xc @ (y - y.mean())) / sxx
    a = float(y.mean() - b * x.mean())
    residual = y - a - b * x
    s2 = float(residual @ residual) / (n - 2)
    t = float(stdtrit(n - 2, 1 - (1 - confidence) / 2))

    def test(value: float, se: float) -> tuple[float, float, float]:
        p = float(2 * stdtr(n - 2, -abs(value / se))) if se > 0 else (0.0 if value else 1.0)
        return value - t * se, value + t * se, p

    slope = test(b, math.sqrt(s2 / sxx))
    intercept = test(a, math.sqrt(s2 * (1 / n + x.mean() ** 2 / sxx)))
    return Line(b, *slope, a, *intercept, df=n - 2)


def _between(frame: pd.DataFrame, confidence: float) -> dict[str, float]:
    """OLS slope of the group means, its t interval and p on k - 2 df."""
    means = frame.groupby("group")[["x", "y"]].mean()
    line = line_fit(means["x"], means["y"], confidence)
    if not np.isfinite(line.slope):
        return {"between_df": line.df}
    return {"between": line.slope, "between_low": line.slope_low, "between_high": line.slope_high,
            "between_p": line.slope_p, "between_df": line.df}  # fmt: skip


def _mixed(frame: pd.DataFrame) -> dict[str, float]:
    """The random-intercept fit (REML) of y ~ xbar + (x - xbar), groups as random intercepts."""
    import statsmodels.formula.api as smf

    frame = frame.assign(
        xbar=frame.groupby("group")["x"].transform("mean"),
    ).assign(xdev=lambda f: f["x"] - f["xbar"])
    with warnings.catch_warnings():  # convergence chatter on tiny designs; estimates still read
        warnings.simplefilter("ignore")
        fit = smf.mixedlm("y ~ xbar + xdev", frame, groups=frame["group"]).fit(reml=True)
    return {
        "mixed_between": float(fit.fe_params["xbar"]),
        "mixed_within": float(fit.fe_params["xdev"]),
        "group_sd": float(math.sqrt(max(float(fit.cov_re.iloc[0, 0]), 0.0))),
        "residual_sd": float(math.sqrt(fit.scale)),
    }


def between_within(
    x: Sequence[float], y: Sequence[float], units: Units, *, confidence: float = 0.95
) -> BetweenWithin:
    """The between-group and within-group slopes of ``y`` on ``x`` (module doc): one row per
    training run (``units.unit``), grouped by ``units.block`` (the objective). Rows with a
    non-finite value are left out; too few groups or rows give NaN with a note."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    check_units(units, "between_within", len(x))
    keep = np.isfinite(x) & np.isfinite(y)
    frame = pd.DataFrame({"x": x[keep], "y": y[keep], "group": np.asarray(units.block)[keep]})
    n, k = len(frame), frame["group"].nunique()
    within = fixed_effects_slope(frame["x"], frame["y"], units.take(keep), confidence=confidence)
    values = {
        "within": within.slope, "within_low": within.low, "within_high": within.high,
        "within_p": within.p, "within_df": within.df,
        **_between(frame, confidence),
    }  # fmt: skip
    notes = [within.note] if within.note else []
    if k < 3:
        notes.append(f"{k} groups: no between-group slope (it needs 3)")
    elif n > k:  # the random intercept needs some group with several runs
        values |= _mixed(frame)
    return BetweenWithin(n_rows=n, n_groups=k, note="; ".join(notes), **values)

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


def _between(frame: pd.DataFrame, confidence: float) -> dict[str, float]:
    """OLS slope of the group means, its t interval and p on k - 2 df."""
    from scipy.special import stdtr, stdtrit

    means = frame.groupby("group")[["x", "y"]].mean()
    k = len(means)
    if k < 3:
        return {"between_df": max(k - 2, 0)}
    xm, ym = means["x"].to_numpy(), means["y"].to_numpy()
    xc = xm - xm.mean()
    sxx = float(xc @ xc)
    if sxx == 0.0:
        return {"between_df": k - 2}
    b = float(xc @ (ym - ym.mean())) / sxx
    residual = ym - ym.mean() - b * xc
    se = math.sqrt(float(residual @ residual) / (k - 2) / sxx)
    half = float(stdtrit(k - 2, 1 - (1 - confidence) / 2)) * se
    p = float(2 * stdtr(k - 2, -abs(b / se))) if se > 0 else (0.0 if b else 1.0)
    return {"between": b, "between_low": b - half, "between_high": b + half,
            "between_p": p, "between_df": k - 2}  # fmt: skip


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

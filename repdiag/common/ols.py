"""Ordinary least squares across models: a fit, its coefficient table and statsmodels' summary.

The binding paper (Chung and Kim 2026, Sec. 5) fits a bivariate OLS ``binding ~ JER +
same_different`` over its 26 encoders (R^2 = 0.78); :func:`fit_ols` fits the same with
statsmodels on a table with one row per model, :func:`ols_table` lays fits out long (one row per
fit and term) and :func:`ols_summary_text` prints statsmodels' summaries without their clock.
As in :mod:`repdiag.common.statistics`, too few rows give NaN values and a ``note``, never an
exception.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from repdiag.common.statistics import (
    DEFAULT_MIN_MODELS,
    NAN,
    complete_rows,
    is_constant,
    require_columns,
    too_few_note,
)


@dataclass
class OLSFit:
    """One ordinary-least-squares fit: fit statistics, a coefficient table and statsmodels' summary."""

    response: str
    predictors: list[str]
    n: int
    r2: float = NAN
    adj_r2: float = NAN
    f_pvalue: float = NAN
    aic: float = NAN
    coefficients: pd.DataFrame = field(default_factory=pd.DataFrame)
    summary: str = ""
    note: str = ""

    @property
    def formula(self) -> str:
        return f"{self.response} ~ {' + '.join(self.predictors)}"


COEFFICIENT_COLUMNS = ["term", "coef", "se", "t", "p", "ci_low", "ci_high"]


def fit_ols(
    table: pd.DataFrame,
    response: str,
    predictors: Sequence[str],
    *,
    confidence: float = 0.95,
    min_models: int = DEFAULT_MIN_MODELS,
) -> OLSFit:
    """``response ~ 1 + predictors`` by statsmodels OLS on the complete rows of ``table``.

    R^2 = 1 - RSS/TSS, adjusted R^2 = 1 - (1 - R^2)(n - 1)/(n - p - 1); standard errors from
    s^2 (X'X)^-1 with s^2 = RSS/(n - p - 1); t-tests two-sided on n - p - 1 degrees of freedom.
    """
    predictors = list(predictors)
    require_columns(table, [response, *predictors], "the models table")
    data = table[[response, *predictors]].astype(float)
    data = data[complete_rows(data.to_numpy())]
    n = len(data)
    fit = OLSFit(response=response, predictors=predictors, n=n)
    needed = max(min_models, len(predictors) + 2)
    if n < needed:
        fit.note = too_few_note(n, needed, f"the fit {fit.formula}")
        return fit
    import statsmodels.api as sm  # here, not at the top: ~1 s that the figure jobs never use

    design = sm.add_constant(data[predictors], has_constant="add").rename(
        columns={"const": "Intercept"}
    )
    if is_constant(data[response].to_numpy()):
        fit.note = f"{response} is constant across models: R^2 undefined"
        return fit
    if np.linalg.matrix_rank(design.to_numpy()) < design.shape[1]:
        fit.note = "predictors are constant or collinear across models: coefficients not identified"
        return fit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small-n kurtosis/omnibus warnings in the summary
        result = sm.OLS(data[response], design).fit()
        summary = without_clock(result.summary(alpha=1 - confidence, title=fit.formula).as_text())
    ci = result.conf_int(alpha=1 - confidence)
    fit.coefficients = pd.DataFrame(
        {
            "term": design.columns,
            "coef": result.params.to_numpy(),
            "se": result.bse.to_numpy(),
            "t": result.tvalues.to_numpy(),
            "p": result.pvalues.to_numpy(),
            "ci_low": ci.iloc[:, 0].to_numpy(),
            "ci_high": ci.iloc[:, 1].to_numpy(),
        }
    )
    fit.r2, fit.adj_r2 = float(result.rsquared), float(result.rsquared_adj)
    fit.f_pvalue, fit.aic = float(result.f_pvalue), float(result.aic)
    fit.summary = summary
    return fit


def ols_table(fits: Sequence[OLSFit]) -> pd.DataFrame:
    """Long table: one row per fit and term, with the fit statistics repeated on each row."""
    rows = []
    for fit in fits:
        head = {
            "formula": fit.formula,
            "response": fit.response,
            "n": fit.n,
            "r2": fit.r2,
            "adj_r2": fit.adj_r2,
            "f_pvalue": fit.f_pvalue,
            "aic": fit.aic,
        }
        if fit.coefficients.empty:
            rows.append({**head, **dict.fromkeys(COEFFICIENT_COLUMNS, NAN), "note": fit.note})
        for record in fit.coefficients.to_dict("records"):
            rows.append({**head, **record, "note": fit.note})
    columns = ["formula", "response", "n", "r2", "adj_r2", "f_pvalue", "aic"]
    return pd.DataFrame(rows, columns=[*columns, *COEFFICIENT_COLUMNS, "note"])


# statsmodels stamps its summary with the date and time of the fit ("Date:", "Time:" cells)
CLOCK_CELL = re.compile(r"^(Date|Time):\s+\S.*?(?=\s{2,}\S)", re.MULTILINE)


def without_clock(summary: str) -> str:
    """statsmodels' summary with its Date and Time cells blanked (widths kept), so that two fits
    of the same data print the same text."""
    return CLOCK_CELL.sub(lambda match: " " * len(match.group(0)), summary)


def ols_summary_text(fits: Sequence[OLSFit]) -> str:
    """statsmodels' summary of every fit, or its note when it could not be fitted."""
    parts = []
    for fit in fits:
        body = fit.summary or f"not fitted (n = {fit.n}): {fit.note}"
        parts.append(f"=== {fit.formula} ===\n{body}\n")
    return "\n".join(parts)

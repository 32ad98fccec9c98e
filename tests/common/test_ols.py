"""repdiag.common.ols: the OLS fit against numpy least squares, its summary without a clock,
and notes for too few rows and collinear predictors."""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.common.ols import fit_ols, ols_summary_text, ols_table

TOL = 1e-8


def test_ols_matches_numpy_least_squares():
    rng = np.random.default_rng(10)
    n = 15
    table = pd.DataFrame({"jer": rng.normal(20, 5, n), "same_different": rng.uniform(0.5, 0.9, n)})
    table["binding"] = 0.01 * table["jer"] + 0.3 * table["same_different"] + rng.normal(0, 0.03, n)
    fit = fit_ols(table, "binding", ["jer", "same_different"])
    X = np.column_stack([np.ones(n), table["jer"], table["same_different"]])
    y = table["binding"].to_numpy()
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    dof = n - 3
    s2 = resid @ resid / dof
    se = np.sqrt(np.diag(s2 * np.linalg.inv(X.T @ X)))
    r2 = 1 - (resid @ resid) / ((y - y.mean()) @ (y - y.mean()))
    coefs = fit.coefficients.set_index("term")
    np.testing.assert_allclose(coefs["coef"], coef, rtol=0, atol=TOL)
    np.testing.assert_allclose(coefs["se"], se, rtol=0, atol=TOL)
    np.testing.assert_allclose(coefs["p"], 2 * sps.t.sf(np.abs(coef / se), dof), rtol=0, atol=TOL)
    assert fit.r2 == pytest.approx(r2, abs=TOL)
    assert fit.adj_r2 == pytest.approx(1 - (1 - r2) * (n - 1) / dof, abs=TOL)
    assert list(coefs.index) == ["Intercept", "jer", "same_different"]
    assert "R-squared:" in fit.summary and fit.formula == "binding ~ jer + same_different"
    # A univariate fit's R^2 is the squared Pearson r.
    uni = fit_ols(table, "binding", ["jer"])
    assert uni.r2 == pytest.approx(np.corrcoef(table["jer"], y)[0, 1] ** 2, abs=TOL)


def test_the_ols_summary_carries_no_clock(monkeypatch):
    """statsmodels prints the date and time of the fit; two runs must print the same text."""
    rng = np.random.default_rng(3)
    table = pd.DataFrame({"jer": rng.normal(20, 5, 12)})
    table["binding"] = 0.01 * table["jer"] + rng.normal(0, 0.03, 12)
    first = fit_ols(table, "binding", ["jer"]).summary
    monkeypatch.setattr(
        time, "localtime", lambda *_: time.struct_time((1999, 12, 31, 23, 59, 58, 4, 365, 0))
    )
    second = fit_ols(table, "binding", ["jer"]).summary
    assert first == second
    assert "Date:" not in first and "Time:" not in first and "1999" not in second
    assert (
        "Prob (F-statistic):" in first and "Log-Likelihood:" in first
    )  # the right-hand cells stay


def test_ols_notes_for_too_few_and_collinear():
    table = pd.DataFrame(
        {"binding": [0.1, 0.2, 0.3], "jer": [1.0, 2.0, 4.0], "same_different": [0.5, 0.6, 0.8]}
    )
    fit = fit_ols(table, "binding", ["jer", "same_different"])
    assert math.isnan(fit.r2) and "too few models" in fit.note
    collinear = pd.DataFrame({"binding": [0.1, 0.3, 0.2, 0.4, 0.5], "jer": [1.0, 2, 3, 4, 5]})
    collinear["same_different"] = 2 * collinear["jer"]
    assert "collinear" in fit_ols(collinear, "binding", ["jer", "same_different"]).note
    long = ols_table([fit])
    assert len(long) == 1 and "too few models" in long.loc[0, "note"]
    assert "not fitted" in ols_summary_text([fit])

"""repdiag.common.statistics: correlations, intervals and partial correlations against closed
forms and independent computations."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.common import statistics as stats
from repdiag.core.errors import ConfigError

TOL = 1e-8


def correlated(n: int, seed: int = 0, rho: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return x, rho * x + rng.normal(size=n)


def closed_form_pearson(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """r = cov / (sd sd); two-sided p from t = r sqrt((n-2)/(1-r^2)) on n-2 df."""
    n = len(x)
    xc, yc = x - x.sum() / n, y - y.sum() / n
    r = float(np.dot(xc, yc) / math.sqrt(np.dot(xc, xc) * np.dot(yc, yc)))
    t = r * math.sqrt((n - 2) / (1 - r * r))
    return r, float(2 * sps.t.sf(abs(t), n - 2))


def test_pearson_and_spearman_match_closed_forms():
    x, y = correlated(12)
    result = stats.correlation(x, y, n_boot=200, seed=1)
    r, p = closed_form_pearson(x, y)
    assert result.pearson_r == pytest.approx(r, abs=TOL)
    assert result.pearson_p == pytest.approx(p, abs=TOL)
    rho, p_rho = closed_form_pearson(sps.rankdata(x), sps.rankdata(y))
    assert result.spearman_rho == pytest.approx(rho, abs=TOL)
    assert result.spearman_p == pytest.approx(p_rho, abs=TOL)
    assert result.n == 12 and result.note == ""


def test_rowwise_pearson_matches_numpy_and_flags_constant_rows():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(5, 9)), rng.normal(size=(5, 9))
    x[2] = 0.1  # constant row
    r = stats.rowwise_pearson(x, y)
    for i in (0, 1, 3, 4):
        assert r[i] == pytest.approx(np.corrcoef(x[i], y[i])[0, 1], abs=TOL)
    assert np.isnan(r[2])


def test_bootstrap_interval_is_seeded_and_matches_an_explicit_loop():
    x, y = correlated(10, seed=4)
    first = stats.bootstrap_correlation_ci(x, y, n_boot=300, seed=7)
    assert stats.bootstrap_correlation_ci(x, y, n_boot=300, seed=7) == first
    assert stats.bootstrap_correlation_ci(x, y, n_boot=300, seed=8) != first
    # Independent computation: same draws, one resample at a time with numpy.corrcoef.
    rng = np.random.default_rng(7)
    draws = rng.integers(0, 10, size=(300, 10))
    values = []
    for idx in draws:
        if np.ptp(x[idx]) > 0 and np.ptp(y[idx]) > 0:
            values.append(np.corrcoef(x[idx], y[idx])[0, 1])
    low, high = np.quantile(values, [0.025, 0.975])
    assert first[0] == pytest.approx(low, abs=TOL)
    assert first[1] == pytest.approx(high, abs=TOL)
    assert first[2] == len(values)
    r = np.corrcoef(x, y)[0, 1]
    assert first[0] <= r <= first[1]


def test_spearman_bootstrap_ranks_each_resample():
    x, y = correlated(8, seed=5)
    low, high, valid = stats.bootstrap_correlation_ci(x, y, method="spearman", n_boot=50, seed=2)
    draws = np.random.default_rng(2).integers(0, 8, size=(50, 8))
    rhos = [sps.spearmanr(x[i], y[i]).statistic for i in draws]
    rhos = [r for r in rhos if np.isfinite(r)]
    assert (low, high) == pytest.approx(tuple(np.quantile(rhos, [0.025, 0.975])), abs=TOL)
    assert valid == len(rhos)


def test_too_few_models_and_constant_columns_give_notes_not_errors():
    few = stats.correlation([1.0, 2.0, 3.0], [2.0, 1.0, 4.0])
    assert few.n == 3 and math.isnan(few.pearson_r) and "too few models" in few.note
    flat = stats.correlation([1.0, 2.0, 3.0, 4.0], [0.125] * 4)
    assert math.isnan(flat.pearson_r) and "target constant" in flat.note
    missing = stats.correlation([1.0, np.nan, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 5.0, 4.0])
    assert missing.n == 4  # pairwise-complete rows


def test_correlation_table_rows_per_metric():
    x, y = correlated(9, seed=6)
    table = pd.DataFrame({"binding": y, "jer": x, "g_iso": np.arange(9.0)})
    frame = stats.correlation_table(table, "binding", ["jer", "g_iso"], n_boot=100)
    assert list(frame["metric"]) == ["jer", "g_iso"]
    assert frame.loc[0, "pearson_r"] == pytest.approx(np.corrcoef(x, y)[0, 1], abs=TOL)
    with pytest.raises(ConfigError, match="nope"):
        stats.correlation_table(table, "binding", ["nope"])


def test_correlation_table_prints_the_permutation_p_beside_the_t_p_up_to_ten_rows():
    from repdiag.common.exact import (
        PERMUTATION_DRAWS,
        exact_correlation_p,
        permutation_correlation_p,
    )

    x, y = correlated(7, seed=8)
    table = pd.DataFrame({"binding": y, "jer": x, "g_iso": np.arange(7.0) ** 2})
    frame = stats.correlation_table(table, "binding", ["jer", "g_iso"], n_boot=100, seed=3)
    columns = frame.columns.tolist()
    assert columns[columns.index("pearson_p") + 1] == "pearson_p_exact"
    assert columns[-2:] == ["n_bootstrap", "n_permutations"]
    for i, metric in enumerate(["jer", "g_iso"]):
        expected = permutation_correlation_p(table[metric], y)  # 7! orders, all enumerated
        assert frame.loc[i, "pearson_p_exact"] == expected
    assert (frame["n_permutations"] == PERMUTATION_DRAWS).all()
    # n = 10: Monte Carlo with the table's seed and draws
    x, y = correlated(10, seed=9)
    result = stats.correlation(x, y, n_boot=100, seed=5, n_perm=3000)
    assert result.pearson_p_exact == permutation_correlation_p(x, y, n_draws=3000, seed=5)
    assert result.pearson_p_exact == exact_correlation_p(x, y, n_draws=3000, seed=5)
    # above 10 rows, and where r is undefined, no permutation p
    x, y = correlated(11, seed=9)
    assert math.isnan(stats.correlation(x, y, n_boot=100).pearson_p_exact)
    assert math.isnan(stats.correlation([1.0, 2.0, 3.0, 4.0], [0.5] * 4).pearson_p_exact)


def test_correlation_with_units_checks_them_and_computes_the_same():
    from repdiag.common.units import ReplicationError, Units

    x, y = correlated(9, seed=6)
    table = pd.DataFrame(
        {"binding": y, "jer": x, "model": [f"m{i}" for i in range(9)], "unit": list("abcdefghi")}
    )
    units = Units.of(table, "unit", rows="model", name="objective")
    checked = stats.correlation_table(table, "binding", ["jer"], units=units, n_boot=100)
    plain = stats.correlation_table(table, "binding", ["jer"], n_boot=100)
    pd.testing.assert_frame_equal(checked, plain)
    assert checked.loc[0, "pearson_r"] == pytest.approx(np.corrcoef(x, y)[0, 1], abs=TOL)
    seeds = Units.of(table.assign(unit=list("abcdefgha")), "unit", rows="model", name="objective")
    with pytest.raises(ReplicationError, match=r"correlation: .* \(objective\): a: m0, m8\."):
        stats.correlation_table(table, "binding", ["jer"], units=seeds, n_boot=100)
    missing = Units.of(table.assign(unit=[*"abcdefgh", np.nan]), "unit", rows="model")
    with pytest.raises(ReplicationError, match=r"m8 \(unit 'nan', block 'all'\)"):
        stats.correlation(x, y, units=missing, n_boot=100)


def test_partial_correlation_is_residual_on_residual():
    rng = np.random.default_rng(11)
    n = 20
    z = rng.normal(size=(n, 2))
    x = z @ [0.8, -0.3] + rng.normal(size=n)
    y = 0.5 * x + z @ [0.2, 0.6] + rng.normal(size=n)
    result = stats.partial_correlation(x, y, z, n_boot=100, seed=0)
    design = np.column_stack([np.ones(n), z])
    rx = x - design @ np.linalg.lstsq(design, x, rcond=None)[0]
    ry = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    r = np.corrcoef(rx, ry)[0, 1]
    dof = n - 2 - 2
    assert result.r == pytest.approx(r, abs=TOL)
    assert result.dof == dof
    assert result.p == pytest.approx(
        2 * sps.t.sf(abs(r * math.sqrt(dof / (1 - r * r))), dof), abs=TOL
    )
    # Precision-matrix form: r_xy.Z = -P_xy / sqrt(P_xx P_yy).
    precision = np.linalg.inv(np.corrcoef(np.column_stack([x, y, z]).T))
    assert result.r == pytest.approx(
        -precision[0, 1] / math.sqrt(precision[0, 0] * precision[1, 1]), abs=TOL
    )
    assert result.ci_low <= result.r <= result.ci_high
    assert result.zero_order_r == pytest.approx(np.corrcoef(x, y)[0, 1], abs=TOL)


def test_partial_table_with_one_covariate_matches_the_textbook_formula():
    rng = np.random.default_rng(12)
    table = pd.DataFrame(rng.normal(size=(10, 3)), columns=["jer", "binding", "zs"])
    frame = stats.partial_table(table, "jer", "binding", [["zs"]], n_boot=100)
    c = table.corr().to_numpy()
    expected = (c[0, 1] - c[0, 2] * c[1, 2]) / math.sqrt((1 - c[0, 2] ** 2) * (1 - c[1, 2] ** 2))
    assert frame.loc[0, "r"] == pytest.approx(expected, abs=TOL)
    assert frame.loc[0, "controls"] == "zs"
    empty = stats.partial_table(table, "jer", "binding", [], empty_note="none configured")
    assert empty.loc[0, "note"] == "none configured"


def test_a_correlation_over_no_rows_is_a_note_not_an_error():
    """A model set with no members (binding_replicate's runs hold no objective family) gives
    an empty table row with its note; before, the mask's reshape raised on zero rows."""
    from repdiag.common.statistics import complete_rows, correlation

    assert complete_rows(np.array([]), np.array([])).tolist() == []
    result = correlation(np.array([]), np.array([]))
    assert result.n == 0 and result.note.startswith("too few models for a correlation: 0 < 4")

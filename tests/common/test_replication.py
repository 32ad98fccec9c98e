"""The unit of replication: the cluster bootstrap and the seed-blocked permutation test against
closed forms and exhaustive enumeration, per-seed slopes against an independent fit, the seed
fixed-effects slope against least squares with block dummies, and every primitive refusing
pooled checkpoints and rows without a unit or seed key, naming them."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.common.replication import (
    block_correlations,
    block_slopes,
    blocked_permutation,
    cluster_bootstrap,
    describe,
    fixed_effects_slope,
    t_interval,
)
from repdiag.common.statistics import correlation
from repdiag.common.units import ReplicationError, Units
from tests.common.test_exact import enumerated_sign_flip_p
from tests.common.test_units import six_runs


def seeded(blocks) -> Units:
    """One training run per row (``run<i>``), blocked by ``blocks`` (the seeds)."""
    blocks = [str(b) for b in blocks]
    return Units(tuple(f"run{i}" for i in range(len(blocks))), tuple(blocks))


PRIMITIVES = {
    "cluster_bootstrap": lambda x, y, u: cluster_bootstrap(lambda r: x[r].mean(), u, n_boot=50),
    "blocked_permutation": lambda x, y, u: blocked_permutation(x, y, u, n_perm=50),
    "block_slopes": lambda x, y, u: block_slopes(x, y, u),
    "block_correlations": lambda x, y, u: block_correlations(x, y, u),
    "fixed_effects_slope": lambda x, y, u: fixed_effects_slope(x, y, u),
    "correlation": lambda x, y, u: correlation(x, y, units=u, n_boot=50),
}
"""Every statistical primitive, called on (x, y, units)."""


@pytest.mark.parametrize("name", PRIMITIVES)
def test_every_primitive_computes_on_independent_units(name):
    table = six_runs()
    x, y = table["x"].to_numpy(), table["y"].to_numpy()
    PRIMITIVES[name](x, y, Units.of(table, "run", "seed", rows="model"))


@pytest.mark.parametrize("name", PRIMITIVES)
def test_every_primitive_refuses_two_rows_of_one_run_naming_them(name):
    table = six_runs(run=["r0", "r0", "r1", "r2", "r3", "r3"])  # m1 and m5: checkpoints
    x, y = table["x"].to_numpy(), table["y"].to_numpy()
    with pytest.raises(ReplicationError) as err:
        PRIMITIVES[name](x, y, Units.of(table, "run", "seed", rows="model"))
    message = str(err.value)
    assert message.startswith(f"{name}: rows are not independent units (training run)")
    assert "r0: m0, m1; r3: m4, m5" in message and "m2" not in message
    assert "Keep one row per training run" in message


@pytest.mark.parametrize("name", PRIMITIVES)
@pytest.mark.parametrize(
    ("column", "value", "shown"),
    [("seed", np.nan, "block 'nan'"), ("seed", None, "block 'None'"), ("run", None, "unit 'None'")],
)
def test_every_primitive_refuses_a_row_without_a_run_or_seed_naming_it(name, column, value, shown):
    table = six_runs()
    table[column] = table[column].astype(object)
    table.loc[3, column] = value
    x, y = table["x"].to_numpy(), table["y"].to_numpy()
    with pytest.raises(ReplicationError) as err:
        PRIMITIVES[name](x, y, Units.of(table, "run", "seed", rows="model"))
    message = str(err.value)
    assert message.startswith(f"{name}: rows without a training run or block key")
    assert "m3 (unit " in message and shown in message
    assert "m2" not in message and "Record the run and seed of every row" in message


@pytest.mark.parametrize("name", PRIMITIVES)
def test_every_primitive_takes_units_not_bare_seeds(name):
    table = six_runs()
    x, y = table["x"].to_numpy(), table["y"].to_numpy()
    with pytest.raises(ReplicationError, match=f"{name}: takes the Units of its rows"):
        PRIMITIVES[name](x, y, table["seed"].astype(str).tolist())
    if name != "cluster_bootstrap":  # its statistic, not the units, says how many rows
        with pytest.raises(ReplicationError, match=f"{name}: 5 units for 6 rows"):
            PRIMITIVES[name](x, y, Units.of(table.iloc[:5], "run", "seed"))


def test_exact_cluster_bootstrap_of_a_mean_matches_the_closed_form():
    # 3 runs, one row each; statistic: the mean over the rows drawn. Every one of the 3^3
    # ordered draws is enumerated, so the draws' variance is exactly var_plugin(values) / 3.
    values = np.array([2.0, 12.0, 5.0])
    units = Units(("a", "c", "b"), ("0",) * 3)
    result = cluster_bootstrap(lambda rows: values[rows].mean(), units, n_boot=2000)
    assert result.exact and len(result.draws) == 27
    means = np.array([2.0, 5.0, 12.0])
    mean_of_draws = np.sum(result.weights * result.draws)
    variance = np.sum(result.weights * (result.draws - mean_of_draws) ** 2)
    assert mean_of_draws == pytest.approx(means.mean())
    assert variance == pytest.approx(means.var(ddof=0) / 3)
    # the percentile endpoints of the enumerated distribution, computed independently
    enumerated = sorted(np.mean(d) for d in itertools.product(means, repeat=3))
    assert result.low == enumerated[math.ceil(0.025 * 27) - 1]
    assert result.high == enumerated[math.ceil(0.975 * 27) - 1]
    assert result.estimate == pytest.approx(values.mean())


def test_monte_carlo_cluster_bootstrap_resamples_runs():
    # 10 runs, one row each: the variance of the draws' mean is var_plugin(values) / 10
    rng = np.random.default_rng(1)
    values = rng.normal(size=10)
    units = Units(tuple(f"r{i}" for i in range(10)), ("0",) * 10)
    result = cluster_bootstrap(lambda rows: values[rows].mean(), units, n_boot=4000, seed=3)
    assert not result.exact
    assert result.draws.var() == pytest.approx(values.var(ddof=0) / 10, rel=0.1)


def test_cluster_bootstrap_refuses_rows_of_one_run():
    # 2 runs of 3 rows each (checkpoints pooled with their run): refused, naming the rows
    values = np.arange(6.0)
    rows = ("r0_step100", "r0_step200", "r0", "r1_step100", "r1_step200", "r1")
    units = Units(("r0",) * 3 + ("r1",) * 3, ("0",) * 6, "training run", rows)
    with pytest.raises(ReplicationError) as err:
        cluster_bootstrap(lambda rows: values[rows].mean(), units, n_boot=100)
    message = str(err.value)
    assert message.startswith("cluster_bootstrap: rows are not independent units")
    assert "r0: r0_step100, r0_step200, r0; r1: r1_step100, r1_step200, r1" in message
    assert "Keep one row per training run" in message


def test_blocked_permutation_matches_the_closed_form():
    # two seeds of 3 doses, y increasing in x within each: the observed arrangement is the
    # single best of 3! x 3! = 36, so the exact one-sided p is 1/36
    x = [0.0, 0.3, 1.0, 0.0, 0.3, 1.0]
    y = [0.2, 0.4, 0.9, 0.1, 0.5, 0.7]
    result = blocked_permutation(x, y, seeded(["0", "0", "0", "1", "1", "1"]))
    assert result.exact and result.n_permutations == 36
    assert result.p_greater == pytest.approx(1 / 36)
    assert result.r == pytest.approx(np.corrcoef(x, y)[0, 1])


def brute_force_p(x, y, blocks):
    """p over every within-block permutation, computed directly with np.corrcoef."""
    groups = [np.flatnonzero(blocks == b) for b in np.unique(blocks)]
    observed = np.corrcoef(x, y)[0, 1]
    hits = total = 0
    for combo in itertools.product(*(itertools.permutations(g) for g in groups)):
        permuted = y.copy()
        for g, perm in zip(groups, combo, strict=True):
            permuted[g] = y[list(perm)]
        hits += np.corrcoef(x, permuted)[0, 1] >= observed - 1e-12
        total += 1
    return hits / total


def test_blocked_permutation_matches_exhaustive_enumeration_and_monte_carlo():
    rng = np.random.default_rng(7)
    blocks = np.repeat(["0", "1", "2"], 4)
    x = np.tile([0.0, 0.1, 0.3, 1.0], 3)
    y = 0.3 * x + rng.normal(scale=0.3, size=12) + np.repeat([0.0, 1.0, -1.0], 4)
    exact = blocked_permutation(x, y, seeded(blocks), n_perm=20000)
    assert exact.exact and exact.n_permutations == 24**3
    assert exact.p_greater == pytest.approx(brute_force_p(x, y, blocks))
    sampled = blocked_permutation(x, y, seeded(blocks), n_perm=5000, seed=2)
    assert not sampled.exact
    assert sampled.p_greater == pytest.approx(exact.p_greater, abs=0.03)


def test_block_slopes_give_a_t_interval_over_seeds():
    rng = np.random.default_rng(0)
    blocks = np.repeat(["0", "1", "2", "3"], 4)
    x = np.tile([0.0, 0.1, 0.3, 1.0], 4)
    y = 2.0 * x + np.repeat([0.0, 5.0, -3.0, 1.0], 4) + rng.normal(scale=0.2, size=16)
    result = block_slopes(x, y, seeded(blocks))
    independent = [np.polyfit(x[blocks == b], y[blocks == b], 1)[0] for b in "0123"]
    assert list(result.slopes.values()) == pytest.approx(independent)
    test = sps.ttest_1samp(independent, 0.0)
    ci = test.confidence_interval(0.95)
    assert (result.mean, result.low, result.high) == pytest.approx(
        (np.mean(independent), ci.low, ci.high)
    )
    assert result.p == pytest.approx(test.pvalue)
    assert result.n_blocks == 4 and result.n_rows == 16
    # beside the t p, the exact sign-flip p of the four slopes: all positive, 2 / 2^4
    assert result.p_exact == pytest.approx(enumerated_sign_flip_p(independent), abs=0.0) == 0.125
    exact = block_slopes(x, 2.0 * x + np.repeat([0.0, 5.0, -3.0, 1.0], 4), seeded(blocks))
    assert exact.mean == pytest.approx(2.0) and exact.se == pytest.approx(0.0, abs=1e-12)


def test_block_slopes_name_blocks_without_a_slope():
    result = block_slopes([0.0, 1.0, 0.5], [1.0, 2.0, 3.0], seeded(["0", "0", "1"]))
    assert result.n_blocks == 1 and "['1']" in result.note
    assert not np.isfinite(result.low)


def fixed_effects_by_hand(x, y, blocks):
    """OLS on [x, one dummy per block] by numpy lstsq: the slope, its se from
    s^2 (X'X)^-1 with s^2 = RSS / (n - k - 1), and the two-sided t p on n - k - 1 df."""
    levels = sorted(set(blocks))
    design = np.column_stack([x, *[(np.asarray(blocks) == b).astype(float) for b in levels]])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    df = len(y) - len(levels) - 1
    se = math.sqrt(residual @ residual / df * np.linalg.inv(design.T @ design)[0, 0])
    return coef[0], se, df, 2 * sps.t.sf(abs(coef[0] / se), df)


def test_fixed_effects_slope_is_least_squares_with_block_dummies():
    # a small table: 3 seeds x 4 doses, seed offsets, noise
    x = np.tile([0.0, 0.1, 0.3, 1.0], 3)
    offsets = np.repeat([0.0, 5.0, -3.0], 4)
    noise = np.array([0.1, -0.2, 0.05, 0.0, -0.1, 0.15, 0.0, -0.05, 0.2, -0.1, 0.0, 0.1])
    y = 2.0 * x + offsets + noise
    blocks = np.repeat(["0", "1", "2"], 4)
    result = fixed_effects_slope(x, y, seeded(blocks), confidence=0.9)
    b, se, df, p = fixed_effects_by_hand(x, y, blocks)
    assert (result.slope, result.se, result.df, result.p) == pytest.approx((b, se, df, p))
    assert df == 12 - 3 - 1
    half = sps.t.ppf(0.95, 8) * se
    assert (result.low, result.high) == pytest.approx((b - half, b + half))
    assert (result.n_rows, result.n_blocks) == (12, 3)
    # the within-seed slope written out: sum(xw yw) / sum(xw^2), deviations from seed means
    xw = x - np.repeat([x[b == blocks].mean() for b in "012"], 4)
    yw = y - np.repeat([y[b == blocks].mean() for b in "012"], 4)
    assert result.slope == pytest.approx(xw @ yw / (xw @ xw))
    # and statsmodels' formula interface, y ~ x + C(block)
    import statsmodels.formula.api as smf

    fit = smf.ols("y ~ x + C(block)", pd.DataFrame({"x": x, "y": y, "block": blocks})).fit()
    assert (result.slope, result.p) == pytest.approx((fit.params["x"], fit.pvalues["x"]))
    assert result.df == fit.df_resid


def test_fixed_effects_p_counts_the_seeds_a_wald_z_ignores():
    # 4 seeds, 3 doses each: df = 12 - 4 - 1 = 7, not the z of infinitely many
    rng = np.random.default_rng(4)
    blocks = np.repeat(["0", "1", "2", "3"], 3)
    x = np.tile([0.0, 0.5, 1.0], 4)
    y = 0.8 * x + rng.normal(scale=1.0, size=4)[np.arange(4).repeat(3)] + rng.normal(size=12)
    result = fixed_effects_slope(x, y, seeded(blocks))
    b, se, df, p = fixed_effects_by_hand(x, y, blocks)
    assert result.df == df == 7 and result.p == pytest.approx(p)
    assert result.p > 2 * sps.norm.sf(abs(b / se))  # the t p is larger than the Wald z's
    # incomplete rows are left out; too few for a fit: a note, no numbers
    short = fixed_effects_slope([0.0, 1.0, np.nan], [1.0, 2.0, 3.0], seeded("000"))
    assert short.df == 0 and math.isnan(short.p) and "residual df 0 < 1" in short.note
    flat = fixed_effects_slope([1.0, 1.0, 2.0, 2.0], [1.0, 2.0, 3.0, 5.0], seeded("0011"))
    assert math.isnan(flat.slope) and "does not vary within any block" in flat.note


def test_t_interval_and_describe():
    mean, se, low, high, p = t_interval([1.0, 2.0, 3.0])
    assert (mean, se) == pytest.approx((2.0, 1 / math.sqrt(3)))
    assert high - mean == pytest.approx(sps.t.ppf(0.975, 2) * se)
    assert describe(mean, low, high, p, "n = 3 seeds").endswith("(n = 3 seeds)")
    assert p == pytest.approx(sps.ttest_1samp([1.0, 2.0, 3.0], 0.0).pvalue)
    assert describe(mean, low, high, p, "n = 3") == "2.000 [-0.48, 4.48], p = 0.074 (n = 3)"
    assert describe(math.nan, 0, 0, 0, "n = 0") == "n/a (n = 0)"
    assert describe(1.5, math.nan, math.nan, math.nan) == "1.500 [n/a, n/a], p = n/a"


def test_monte_carlo_permutation_p_counts_the_identity_as_the_plus_one():
    # three seeds of 8 doses, y strictly increasing in x within each: only the identity reaches
    # the observed r (another draw does with probability 3 / (8!)^3), so p = 1 / (1 + B)
    x = np.tile(np.arange(8.0), 3)
    y = x + np.repeat([0.0, 10.0, -4.0], 8)
    result = blocked_permutation(x, y, seeded(np.repeat(["0", "1", "2"], 8)), n_perm=500, seed=1)
    assert not result.exact and result.n_permutations == 499
    assert result.p_greater == pytest.approx(1 / 500)


def test_block_correlations_match_scipy_per_seed_and_a_t_interval_over_seeds():
    rng = np.random.default_rng(5)
    blocks = np.repeat(["0", "1", "2"], 6)
    x = rng.random(18)
    y = x + rng.normal(scale=0.3, size=18) + np.repeat([0.0, 3.0, -2.0], 6)
    x[1] = x[0]  # a tie: mid-ranks, as scipy's spearmanr
    result = block_correlations(x, y, seeded(blocks))
    rhos = [sps.spearmanr(x[blocks == b], y[blocks == b]).statistic for b in "012"]
    assert list(result.values.values()) == pytest.approx(rhos)
    test = sps.ttest_1samp(rhos, 0.0)
    ci = test.confidence_interval(0.95)
    assert (result.mean, result.low, result.high, result.p) == pytest.approx(
        (np.mean(rhos), ci.low, ci.high, test.pvalue)
    )
    pearson = block_correlations(x, y, seeded(blocks), method="pearson")
    assert pearson.values["1"] == pytest.approx(np.corrcoef(x[6:12], y[6:12])[0, 1])
    short = block_correlations(
        [0.0, 1.0, 2.0, 0.0, 1.0], [1.0, 3.0, 2.0, 0.0, 1.0], seeded("00011")
    )
    assert short.n_blocks == 1 and "['1']" in short.note and not np.isfinite(short.low)


def test_t_interval_is_the_shared_mean_interval_with_its_p():
    from repdiag.common.intervals import mean_interval

    values = [0.3, 1.1, -0.2, 0.9, 0.4]
    mean, se, low, high, p = t_interval(values, 0.9)
    assert (mean, low, high) == pytest.approx(
        np.asarray(mean_interval(np.array(values), 0.9))[[0, 2, 3]]
    )
    assert se == pytest.approx(np.std(values, ddof=1) / math.sqrt(5))
    assert p == pytest.approx(sps.ttest_1samp(values, 0.0).pvalue)


def test_a_long_refusal_names_three_units_and_counts_the_rest():
    labels = tuple(f"objective{i} [" + "x" * 200 + "]" for i in range(5))
    units = Units(tuple(np.repeat(labels, 2)), ("0",) * 10, "training run",
                  tuple(f"m{i}" for i in range(10)))  # fmt: skip
    with pytest.raises(ReplicationError) as err:
        cluster_bootstrap(lambda rows: float(len(rows)), units, n_boot=10)
    message = str(err.value)
    assert "m0, m1" in message and "m4, m5" in message and "m6" not in message
    assert "; and 2 more units like these" in message and len(message) < 600
    assert "objective0 [" + "x" * 47 + "…: m0, m1" in message

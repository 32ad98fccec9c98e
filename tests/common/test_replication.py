"""The unit of replication: the cluster bootstrap and the seed-blocked permutation test against
closed forms and exhaustive enumeration, per-seed slopes against an independent fit, the mixed
model against a generated effect, and pooled checkpoints refused."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.common.replication import (
    ReplicationError,
    Units,
    block_correlations,
    block_slopes,
    blocked_permutation,
    cluster_bootstrap,
    describe,
    format_p,
    holm,
    mixed_slope,
    require_independent,
    sign_flip_p,
    t_interval,
)


def test_pooled_checkpoints_are_refused_naming_the_rows():
    table = pd.DataFrame(
        {
            "model": ["dose_1_s0", "dose_1_s0_step100", "dose_1_s0_step200", "dose_1_s1"],
            "run": ["1/s0", "1/s0", "1/s0", "1/s1"],
            "seed": [0, 0, 0, 1],
        }
    )
    units = Units.of(table, "run", "seed")
    with pytest.raises(ReplicationError) as err:
        require_independent(units, table["model"], "r(JER, binding)")
    message = str(err.value)
    assert "r(JER, binding)" in message
    assert "dose_1_s0, dose_1_s0_step100, dose_1_s0_step200" in message
    assert "dose_1_s1" not in message
    finals = Units.of(table.iloc[[0, 3]], "run", "seed")
    require_independent(finals, ["dose_1_s0", "dose_1_s1"], "finals")


def test_exact_cluster_bootstrap_of_a_mean_matches_the_closed_form():
    # 3 runs of 2 rows each; statistic: the mean over the rows drawn. Every one of the 3^3
    # ordered draws is enumerated, so the draws' variance is exactly var_plugin(unit means) / 3.
    values = np.array([1.0, 3.0, 4.0, 6.0, 10.0, 14.0])
    units = Units(("a", "a", "b", "b", "c", "c"), ("0",) * 6)
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


def test_monte_carlo_cluster_bootstrap_resamples_runs_not_rows():
    # 10 runs, each of 5 identical rows: resampling rows would shrink the spread by sqrt(5);
    # resampling runs gives var(unit means) / 10.
    rng = np.random.default_rng(1)
    unit_means = rng.normal(size=10)
    values = np.repeat(unit_means, 5)
    units = Units(tuple(np.repeat([f"r{i}" for i in range(10)], 5)), ("0",) * 50)
    result = cluster_bootstrap(lambda rows: values[rows].mean(), units, n_boot=4000, seed=3)
    assert not result.exact
    expected = unit_means.var(ddof=0) / 10
    assert result.draws.var() == pytest.approx(expected, rel=0.1)


def test_blocked_permutation_matches_the_closed_form():
    # two seeds of 3 doses, y increasing in x within each: the observed arrangement is the
    # single best of 3! x 3! = 36, so the exact one-sided p is 1/36
    x = [0.0, 0.3, 1.0, 0.0, 0.3, 1.0]
    y = [0.2, 0.4, 0.9, 0.1, 0.5, 0.7]
    result = blocked_permutation(x, y, ["0", "0", "0", "1", "1", "1"])
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
    exact = blocked_permutation(x, y, blocks, n_perm=20000)
    assert exact.exact and exact.n_permutations == 24**3
    assert exact.p_greater == pytest.approx(brute_force_p(x, y, blocks))
    sampled = blocked_permutation(x, y, blocks, n_perm=5000, seed=2)
    assert not sampled.exact
    assert sampled.p_greater == pytest.approx(exact.p_greater, abs=0.03)


def test_block_slopes_give_a_t_interval_over_seeds():
    rng = np.random.default_rng(0)
    blocks = np.repeat(["0", "1", "2", "3"], 4)
    x = np.tile([0.0, 0.1, 0.3, 1.0], 4)
    y = 2.0 * x + np.repeat([0.0, 5.0, -3.0, 1.0], 4) + rng.normal(scale=0.2, size=16)
    result = block_slopes(x, y, blocks)
    independent = [np.polyfit(x[blocks == b], y[blocks == b], 1)[0] for b in "0123"]
    assert list(result.slopes.values()) == pytest.approx(independent)
    test = sps.ttest_1samp(independent, 0.0)
    ci = test.confidence_interval(0.95)
    assert (result.mean, result.low, result.high) == pytest.approx(
        (np.mean(independent), ci.low, ci.high)
    )
    assert result.p == pytest.approx(test.pvalue)
    assert result.n_blocks == 4 and result.n_rows == 16
    exact = block_slopes(x, 2.0 * x + np.repeat([0.0, 5.0, -3.0, 1.0], 4), blocks)
    assert exact.mean == pytest.approx(2.0) and exact.se == pytest.approx(0.0, abs=1e-12)


def test_block_slopes_name_blocks_without_a_slope():
    result = block_slopes([0.0, 1.0, 0.5], [1.0, 2.0, 3.0], ["0", "0", "1"])
    assert result.n_blocks == 1 and "['1']" in result.note
    assert not np.isfinite(result.low)


def test_mixed_model_recovers_a_generated_slope():
    rng = np.random.default_rng(4)
    seeds = np.repeat(np.arange(8), 6)
    x = rng.uniform(0.1, 0.9, size=seeds.size)
    y = 2.5 * x + rng.normal(scale=1.0, size=8)[seeds] + rng.normal(scale=0.1, size=seeds.size)
    result = mixed_slope(x, y, seeds)
    assert result.n_rows == 48 and result.n_blocks == 8 and result.converged
    assert result.low < 2.5 < result.high
    assert result.slope == pytest.approx(2.5, abs=0.15)
    assert result.block_variance == pytest.approx(1.0, rel=0.8)
    assert result.p < 1e-6


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
    result = blocked_permutation(x, y, np.repeat(["0", "1", "2"], 8), n_perm=500, seed=1)
    assert not result.exact and result.n_permutations == 499
    assert result.p_greater == pytest.approx(1 / 500)


def test_block_correlations_match_scipy_per_seed_and_a_t_interval_over_seeds():
    rng = np.random.default_rng(5)
    blocks = np.repeat(["0", "1", "2"], 6)
    x = rng.random(18)
    y = x + rng.normal(scale=0.3, size=18) + np.repeat([0.0, 3.0, -2.0], 6)
    x[1] = x[0]  # a tie: mid-ranks, as scipy's spearmanr
    result = block_correlations(x, y, blocks)
    rhos = [sps.spearmanr(x[blocks == b], y[blocks == b]).statistic for b in "012"]
    assert list(result.values.values()) == pytest.approx(rhos)
    test = sps.ttest_1samp(rhos, 0.0)
    ci = test.confidence_interval(0.95)
    assert (result.mean, result.low, result.high, result.p) == pytest.approx(
        (np.mean(rhos), ci.low, ci.high, test.pvalue)
    )
    pearson = block_correlations(x, y, blocks, method="pearson")
    assert pearson.values["1"] == pytest.approx(np.corrcoef(x[6:12], y[6:12])[0, 1])
    short = block_correlations([0.0, 1.0, 2.0, 0.0, 1.0], [1.0, 3.0, 2.0, 0.0, 1.0], list("00011"))
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


# --------------------------------------------------------------------------- exact tests, families


def enumerated_sign_flip_p(values) -> float:
    """The two-sided sign-flip p written out: every one of the 2^k sign vectors, in exact
    rational arithmetic (the values are integers or exact binary fractions), counting those
    whose |sum| reaches the observed |sum|."""
    from fractions import Fraction

    exact = [Fraction(v) for v in values]
    observed = abs(sum(exact))
    hits = sum(
        abs(sum(s * v for s, v in zip(signs, exact, strict=True))) >= observed
        for signs in itertools.product((1, -1), repeat=len(exact))
    )
    return hits / 2 ** len(exact)


@pytest.mark.parametrize("k", range(1, 9))
def test_sign_flip_p_is_the_exhaustive_enumeration(k):
    rng = np.random.default_rng(k)
    # small integers: ties between |values| and between sums are certain, and exact in floats
    integers = rng.integers(-3, 4, size=k).astype(float)
    assert sign_flip_p(integers) == pytest.approx(enumerated_sign_flip_p(integers), abs=1e-15)
    # continuous values on a grid of 2^-20 (exact binary fractions): no rounding in either sum
    grid = np.round(rng.normal(0.4, 1.0, size=k) * 2**20) / 2**20
    assert sign_flip_p(grid) == pytest.approx(enumerated_sign_flip_p(grid), abs=1e-15)


def test_sign_flip_p_ties_and_nan_and_its_floor():
    # [1, 1, -1, 3]: sum 4; sign vectors with |sum| >= 4: (+,+,-,+) -> 4, (+,+,+,+) -> 6,
    # (-,+,+,+) and (+,-,+,+) -> 4, and their four mirror images: 8 of 16
    assert sign_flip_p([1.0, 1.0, -1.0, 3.0]) == pytest.approx(8 / 16)
    assert sign_flip_p([1.0, np.nan, 1.0, -1.0, 3.0]) == pytest.approx(8 / 16)  # NaN dropped
    assert sign_flip_p([0.0, 0.0, 0.0]) == 1.0  # every assignment ties with a zero mean
    assert math.isnan(sign_flip_p([np.nan]))
    for k in range(1, 9):  # all of one sign: only the observed and its mirror reach it
        values = np.random.default_rng(k).uniform(0.5, 2.0, size=k)
        assert sign_flip_p(values) == pytest.approx(2 / 2**k)
        assert sign_flip_p(-values) == pytest.approx(2 / 2**k)


def test_sign_flip_p_monte_carlo_counts_the_observed_as_the_plus_one():
    # k = 20 > the 1000 draws allowed: sampled; all positive values, so a draw reaches the
    # observed |mean| only with its own signs or their mirror (probability 2 / 2^20 each)
    values = np.linspace(1.0, 2.0, 20)
    assert sign_flip_p(values, n_draws=1000, seed=3) == pytest.approx(1 / 1001)
    # a symmetric sample: about half the draws reach a mean that is nearly zero
    mixed = np.array([1.0, -1.0] * 10) + np.linspace(0.0, 0.01, 20)
    assert sign_flip_p(mixed, n_draws=4000, seed=1) > 0.5


def test_holm_against_a_hand_computation_and_statsmodels():
    from statsmodels.stats.multitest import multipletests

    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> 0.06
    # (running maximum); back in the input order
    p = [0.01, 0.04, 0.03, 0.005]
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm(p) == pytest.approx(multipletests(p, method="holm")[1])
    # capped at 1, monotone after the cap
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    # NaN members stay NaN and do not count toward m (m = 2: 0.01 x 2, 0.04 x 1)
    out = holm([0.01, np.nan, 0.04])
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    rng = np.random.default_rng(11)
    for size in (1, 3, 7, 12):
        draws = rng.uniform(0, 0.2, size=size)
        assert holm(draws) == pytest.approx(multipletests(draws, method="holm")[1])
    assert holm([]).size == 0


def test_format_p_prints_the_monte_carlo_floor_as_below_one_over_b():
    assert format_p(1 / 20001, 20000) == "< 5e-05"
    assert format_p(1 / 1001, 1000) == "< 0.001"
    assert format_p(2 / 20001, 20000) == "0.0001"  # one draw reached it: a number, not a bound
    assert format_p(0.01234, 20000) == "0.012"
    assert format_p(1 / 36) == "0.028"  # exact: no floor to state
    assert format_p(1 / 36, None) == "0.028"
    assert format_p(math.nan, 100) == "n/a"

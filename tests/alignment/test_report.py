"""The alignment tables and claims: decision rules on fabricated grids (repdiag.alignment.report)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.alignment.report import claims_table, results_table, summary_table
from repdiag.common.units import ReplicationError
from tests.alignment.fakes import fake_grid, fake_record

# claims ----------------------------------------------------------------------------------------


def _two_methods(differences, metric="tr_intervention"):
    """cosae-all and usae at one fraction, cosae-all ahead by ``differences[seed]`` on M_tr."""
    records = []
    for seed, diff in enumerate(differences):
        records.append(fake_record("usae", 0.01, seed, tr_intervention=0.8, cont_intervention=0.5))
        records.append(
            fake_record("cosae-all", 0.01, seed, tr_intervention=0.8 + diff, cont_intervention=0.9)
        )
    return claims_table(results_table(records)).set_index("claim_id")


def test_claims_follow_the_decision_rules():
    table = results_table(fake_grid())
    claims = claims_table(table).set_index("claim_id")
    assert claims.loc["translation_not_consistency", "verdict"] == "supported"
    # consistency-only reaches the translation of translation-only here: not supported
    assert claims.loc["consistency_not_translation", "verdict"] == "not supported"
    assert claims.loc["cycle_not_proxy", "verdict"] == "supported"
    assert "cosae-distributional" in claims.loc["cycle_not_proxy", "evidence"]
    assert claims.loc["distributional_fails_instance", "verdict"] == "supported"
    assert claims.loc["anchoring_matches_full", "verdict"] == "supported"
    assert claims.loc["cosae_ahead", "verdict"] == "supported"
    # 2 fractions x 2 metrics x 2 baselines (sae_a, usae)
    assert "ahead on 8/8" in claims.loc["cosae_ahead", "evidence"]
    assert "tr_intervention" in claims.loc["cosae_ahead", "evidence"]
    assert set(claims["scope"]) == {"synthetic"}

    behind = claims_table(results_table(fake_grid(cosae_ahead=False))).set_index("claim_id")
    assert behind.loc["cosae_ahead", "verdict"] == "not supported"


def test_claims_on_a_partial_grid_say_not_tested():
    records = [r for r in fake_grid() if r["variant"] in ("sae_a", "usae")]
    claims = claims_table(results_table(records)).set_index("claim_id")
    assert claims.loc["translation_not_consistency", "verdict"] == "not tested"
    assert claims.loc["cosae_ahead", "verdict"] == "not tested"
    assert claims.loc["distributional_fails_instance", "verdict"] == "not tested"


def test_real_runs_get_their_own_scope_and_summary_means():
    real = {
        "pair": "a__b__final",
        "runs": [
            fake_record("cosae-all", 1.0, 0, tr_r2=0.7, jaccard=0.6),
            fake_record("sae_a", 1.0, 0, tr_r2=0.6, jaccard=0.5),
        ],
    }
    table = results_table(fake_grid(), [real])
    assert (table["data"] == "real").sum() == 2
    claims = claims_table(table)
    real_claims = claims[claims["scope"] == "real:a__b__final"].set_index("claim_id")
    assert real_claims.loc["cosae_ahead", "verdict"] == "supported"
    summary = summary_table(table)
    row = summary[(summary["variant"] == "cosae-translation") & (summary["paired_fraction"] == 1.0)]
    assert row["n_seeds"].item() == 3
    assert row["tr_r2"].item() == pytest.approx(0.952)
    assert row["jaccard_std"].item() == pytest.approx(0.002)


@pytest.mark.parametrize(
    ("differences", "verdict"),
    [
        ((0.05, 0.06, 0.04), "supported"),  # above the margin on every seed
        ((0.01, 0.015, 0.012), "mixed"),  # M_tr: below the margin of 0.02 -> not ahead
        ((-0.01, 0.10, 0.10), "mixed"),  # M_tr: mean 0.063 but a sign flip on seed 0
    ],
)
def test_ahead_needs_the_margin_and_the_same_sign_on_every_seed(differences, verdict):
    claims = _two_methods(differences)
    assert claims.loc["cosae_ahead", "verdict"] == verdict
    # M_cont (0.9 vs 0.5) holds in every case, M_tr only in the first
    wins = "2/2" if verdict == "supported" else "1/2"
    assert f"ahead on {wins}" in claims.loc["cosae_ahead", "evidence"]


def test_a_single_comparison_below_the_margin_or_with_a_sign_flip_is_not_supported():
    from repdiag.alignment.report import compare

    ahead = pd.Series([0.90, 0.91, 0.92])
    below = compare(ahead, ahead - 0.01)  # 0.01 < margin 0.02
    flip = compare(ahead, ahead + pd.Series([0.02, -0.1, -0.1]))  # seed 0 behind
    clear = compare(ahead, ahead - 0.05)
    assert (below["ahead"], flip["ahead"], clear["ahead"]) == (False, False, True)
    assert flip["signs"] == "-++"
    # on a grid where every M_tr/M_cont comparison is of the first two kinds: not supported
    records = []
    for seed, (tr, cont) in enumerate([(0.01, -0.03), (0.01, 0.1), (0.015, 0.1)]):
        records.append(fake_record("usae", 0.01, seed, tr_intervention=0.8, cont_intervention=0.5))
        records.append(
            fake_record(
                "cosae-all", 0.01, seed, tr_intervention=0.8 + tr, cont_intervention=0.5 + cont
            )
        )
    claims = claims_table(results_table(records)).set_index("claim_id")
    assert claims.loc["cosae_ahead", "verdict"] == "not supported"


def test_anchoring_match_needs_every_seed_within_the_margin():
    records = []
    for seed, shortfall in enumerate((0.0, 0.01, 0.05)):
        records.append(
            fake_record("cosae-all", 1.0, seed, tr_intervention=0.9, cont_intervention=0.9)
        )
        records.append(
            fake_record(
                "cosae-all",
                0.001,
                seed,
                tr_intervention=0.9 - shortfall,
                cont_intervention=0.9,
            )
        )
    claims = claims_table(results_table(records)).set_index("claim_id")
    # M_cont matches, M_tr falls short by 0.05 > 0.02 on seed 2
    assert claims.loc["anchoring_matches_full", "verdict"] == "mixed"


FRACTIONS = np.linspace(0.01, 0.1, 10)


def _cycle_grid(tr_of, seeds=(0, 1, 2)):
    """Ten models (one variant at ten paired fractions) per seed: cycle R^2 v, M_tr tr_of(v)."""
    return [
        fake_record("usae", float(f), seed, cycle_r2=v, tr_intervention=w, cont_intervention=0.5)
        for seed in seeds
        for f, v, w in zip(FRACTIONS, *tr_of(seed), strict=True)
    ]


def test_cycle_proxy_is_judged_per_seed_with_a_t_interval_over_seeds():
    """The training run is the unit and the seed its block: rho within each seed, the
    t-interval of its mean over seeds (scipy's one-sample t), the seed-blocked permutation p."""
    cycle = np.linspace(0.1, 0.9, 10)
    faithful = claims_table(results_table(_cycle_grid(lambda s: (cycle, cycle))))
    faithful = faithful.set_index("claim_id").loc["cycle_not_proxy"]
    assert faithful["verdict"] == "not supported" and faithful["n_seeds"] == 3
    assert "[1.000, 1.000]" in faithful["evidence"]
    # rho = 1 on each of 3 seeds: the t p is 0, the exact sign-flip p its floor 2 / 2^3; the
    # 10!^3 blocked permutations are sampled (19999) and none reaches the observed: "< 1/B"
    assert "exact sign-flip p = 0.25;" in faithful["evidence"]
    assert (
        "seed-blocked permutation p < 5e-05 (19999 permutations, Monte Carlo)"
        in (faithful["evidence"])
    )
    noise = np.random.default_rng(0).random((3, 10))
    table = results_table(_cycle_grid(lambda s: (cycle, noise[s])))
    row = claims_table(table).set_index("claim_id").loc["cycle_not_proxy"]
    rhos = [sps.spearmanr(cycle, noise[s]).statistic for s in range(3)]
    test = sps.ttest_1samp(rhos, 0.0)
    low, high = test.confidence_interval(0.95)
    assert (
        f"[{low:.3f}, {high:.3f}]" in row["evidence"]
        and f"p = {test.pvalue:.2g}" in row["evidence"]
    )
    assert row["verdict"] == ("supported" if high < 0.9 else "mixed")
    signs = itertools.product((1, -1), repeat=3)
    flips = [abs(np.dot(s, rhos)) >= abs(np.sum(rhos)) - 1e-12 for s in signs]
    assert f"exact sign-flip p = {np.mean(flips):.2g};" in row["evidence"]
    assert "seed-blocked permutation p" in row["evidence"] and "30 runs" in row["evidence"]


def test_cycle_proxy_needs_two_seeds_and_refuses_a_run_listed_twice():
    cycle = np.linspace(0.1, 0.9, 10)
    one_seed = claims_table(results_table(_cycle_grid(lambda s: (cycle, cycle), seeds=(0,))))
    assert one_seed.set_index("claim_id").loc["cycle_not_proxy", "verdict"] == "not tested"
    records = _cycle_grid(lambda s: (cycle, cycle))
    with pytest.raises(ReplicationError, match=r"usae p=0.01 seed 0: usae__p0.01__s0, usae__p0"):
        claims_table(results_table([*records, records[0]]))


def _real_job(differences, pair="a__b__final"):
    """A real pair over seeds: cosae-all ahead of sae_a by ``differences[seed]`` on M_tr and
    M_cont, each run with a bootstrap interval, and the job's interval of the seed mean."""
    runs = []
    for seed, diff in enumerate(differences):
        for variant, value in (("sae_a", 0.4), ("cosae-all", 0.4 + diff)):
            run = fake_record(variant, 1.0, seed, tr_intervention=value, cont_intervention=value)
            run["intervals"] = {"tr_intervention": [value - 0.05, value + 0.05]}
            runs.append(run)
    pooled = [
        {"variant": v, "paired_fraction": 1.0, "n_seeds": len(differences), "intervals": {}}
        for v in ("sae_a", "cosae-all")
    ]
    pooled[1]["intervals"] = {"tr_intervention": [0.41, 0.49]}
    return {"pair": pair, "control": "none", "runs": runs, "seed_intervals": pooled}


def test_real_claims_are_judged_per_seed_with_the_margin():
    steady = results_table([], [_real_job((0.05, 0.06, 0.04))])
    claims = claims_table(steady).set_index("claim_id")
    assert claims.loc["cosae_ahead", "scope"] == "real:a__b__final"
    assert claims.loc["cosae_ahead", "verdict"] == "supported"
    assert claims.loc["cosae_ahead", "n_seeds"] == 3
    assert "signs +++" in claims.loc["cosae_ahead", "evidence"]
    flipped = claims_table(results_table([], [_real_job((0.2, 0.2, -0.01))])).set_index("claim_id")
    assert flipped.loc["cosae_ahead", "verdict"] == "not supported"
    assert "signs ++-" in flipped.loc["cosae_ahead", "evidence"]


def test_real_tables_carry_each_runs_interval_the_seed_spread_and_the_seed_means_interval():
    job = _real_job((0.05, 0.06, 0.04))
    table = results_table([], [job])
    row = table[(table["variant"] == "cosae-all") & (table["seed"] == 1)].iloc[0]
    assert (row["tr_intervention_ci_low"], row["tr_intervention_ci_high"]) == pytest.approx(
        (0.41, 0.51)
    )
    assert np.isnan(row["cont_intervention_ci_low"])  # no interval recorded for it
    summary = summary_table(table, [job]).set_index("variant")
    assert summary.loc["cosae-all", "tr_intervention"] == pytest.approx(0.45)
    assert summary.loc["cosae-all", "tr_intervention_min"] == pytest.approx(0.44)
    assert summary.loc["cosae-all", "tr_intervention_max"] == pytest.approx(0.46)
    assert summary.loc["cosae-all", "tr_intervention_ci_low"] == pytest.approx(0.41)
    assert summary.loc["cosae-all", "tr_intervention_ci_high"] == pytest.approx(0.49)
    assert np.isnan(summary.loc["sae_a", "tr_intervention_ci_low"])
    assert "tr_intervention_exact" not in summary  # no control pair, no exact translator
    # synthetic rows keep their columns and get no interval
    both = summary_table(results_table(fake_grid(), [job]), [job])
    assert both.loc[both["data"] == "synthetic", "tr_intervention_ci_low"].isna().all()

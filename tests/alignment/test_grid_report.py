"""Grid cells, per-job params, config checks, claims and figures of the alignment study."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import yaml

from repdiag.alignment.figures import methods_figure, paired_fraction_figure
from repdiag.alignment.grid import (
    cell_params,
    check_alignment_config,
    grid_cells,
    real_pairs,
    real_params,
    split_variant,
)
from repdiag.alignment.report import SUMMARY_COLUMNS, claims_table, results_table, summary_table
from repdiag.core.config import fill_defaults, load_config
from repdiag.core.errors import ConfigError

MODELS = {"barlow_twins": {}, "clip": {}, "mae": {}}


def _config(alignment=None):
    config = {"models": copy.deepcopy(MODELS), "alignment": copy.deepcopy(alignment or {})}
    fill_defaults(config)
    return config


def test_default_grid_cells():
    alignment = _config()["alignment"]
    cells = grid_cells(alignment)
    # per seed: independent 1 + (sae_a, crosscoder, usae) x 3 fractions + cosae
    # (translation, consistency, all) x 3 + cosae-distributional 1 = 20; three seeds
    assert len(cells) == 60
    assert cells["independent__p0__s0"]["paired_fraction"] == 0.0
    assert cells["cosae-distributional__p0__s2"]["ablation"] == "distributional"
    assert cells["cosae-all__p0.001__s1"] == {
        "variant": "cosae-all",
        "method": "cosae",
        "ablation": "all",
        "paired_fraction": 0.001,
        "seed": 1,
    }
    assert "independent__p1__s0" not in cells
    assert split_variant("sae_a") == ("sae_a", None)


def test_cell_params_hold_only_what_the_cell_uses():
    alignment = _config()["alignment"]
    baseline = cell_params(alignment, "usae__p1__s0")
    assert baseline["weights"] is None
    assert "sw_projections" not in baseline["train"]
    translation = cell_params(alignment, "cosae-translation__p0.01__s0")
    assert translation["weights"] == {"reconstruction": 1.0, "translation": 1.0}
    distributional = cell_params(alignment, "cosae-distributional__p0__s0")
    assert "pair_batch_size" not in distributional["train"]
    assert distributional["train"]["sw_projections"] == 32
    # changing a CoSAE weight changes no baseline cell's params (Snakemake reruns only CoSAE)
    changed = copy.deepcopy(alignment)
    changed["weights"]["consistency"] = 0.5
    assert cell_params(changed, "usae__p1__s0") == baseline
    assert cell_params(changed, "cosae-translation__p0.01__s0") == translation
    assert cell_params(changed, "cosae-all__p1__s0") != cell_params(alignment, "cosae-all__p1__s0")
    with pytest.raises(ConfigError, match="not in the grid"):
        cell_params(alignment, "usae__p0.5__s0")


def test_real_pair_params():
    alignment = _config()["alignment"]
    assert list(real_pairs(alignment)) == ["barlow_twins__clip__final"]
    params = real_params(alignment, "barlow_twins__clip__final")
    assert params["pair"] == {"a": "barlow_twins", "b": "clip", "layer": "final"}
    assert params["weights"]["sae_a"] is None
    assert params["weights"]["cosae-translation"] == {"reconstruction": 1.0, "translation": 1.0}
    assert params["sae"] == {
        "n_latents": 256,
        "k": 16,
        "aux_k": 64,
        "aux_coef": 0.03125,
        "dead_after": 4096,
    }


@pytest.mark.parametrize(
    ("alignment", "message"),
    [
        ({"synthetic": {"n_concepts": 4, "k_active": 5}}, "alignment.synthetic.k_active=5"),
        ({"sae": {"n_latents": 4, "k": 8}}, "alignment.sae.k=8"),
        ({"real": {"sae": {"n_latents": 8}}}, "alignment.real.sae.k=16"),
        ({"real": {"pairs": [{"a": "barlow_twins", "b": "dino"}]}}, r"pairs\[0\].b='dino'"),
        ({"real": {"pairs": [{"a": "mae", "b": "mae"}]}}, "with itself"),
        ({"real": {"pairs": [{"a": "mae", "b": "clip"}, {"a": "mae", "b": "clip"}]}}, "repeats"),
    ],
)
def test_semantic_checks_name_the_key(alignment, message):
    with pytest.raises(ConfigError, match=message):
        check_alignment_config(_config(alignment))


@pytest.mark.parametrize(
    "alignment",
    [
        {"grid": {"paired_fractions": [0.0]}},
        {"grid": {"methods": ["cosae", "sae_b"]}},
        {"weights": {"translation": -1}},
        {"real": {"variants": ["cosae-cycle"]}},
        {"synthetic": {"maps": ["linear"]}},
        {"train": {"steps": 10, "momentum": 0.9}},
    ],
)
def test_schema_rejects_bad_values(tmp_path, alignment):
    base = yaml.safe_load(open("config/test.yaml"))
    base["alignment"] = alignment
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(base))
    with pytest.raises(ConfigError):
        load_config(path)


# claims ----------------------------------------------------------------------------------------
def _record(variant, fraction, seed, **metrics):
    method, ablation = split_variant(variant)
    summary = dict.fromkeys(SUMMARY_COLUMNS, 0.5)
    summary.update(sw_scale=1.0, sw_floor=0.01, sw_translation=0.01)
    summary.update(metrics)
    # the intervention metrics follow the secondary ones unless given
    if "tr_intervention" not in metrics:
        summary["tr_intervention"] = summary["tr_r2"]
    if "cont_intervention" not in metrics:
        summary["cont_intervention"] = summary["jaccard"]
    return {
        "cell": f"{variant}__p{fraction:g}__s{seed}",
        "variant": variant,
        "method": method,
        "ablation": ablation,
        "paired_fraction": fraction,
        "n_paired": int(fraction * 1000),
        "seed": seed,
        "summary": summary,
        "train": {"wall_time_s": 1.0},
    }


def _fake_grid(cosae_ahead=True):
    records = []
    for seed in (0, 1, 2):
        jitter = 0.002 * seed
        records.append(
            _record(
                "independent", 0.0, seed, tr_r2=-1.0, jaccard=0.05, cycle_r2=0.3, sw_translation=0.2
            )
        )
        records.append(
            _record(
                "cosae-distributional",
                0.0,
                seed,
                tr_r2=-0.8,
                jaccard=0.1,
                cycle_r2=0.6,
                sw_translation=0.02,
            )
        )
        for fraction in (0.001, 1.0):
            records.append(
                _record(
                    "cosae-translation", fraction, seed, tr_r2=0.95 + jitter, jaccard=0.8 - jitter
                )
            )
            records.append(
                _record(
                    "cosae-consistency", fraction, seed, tr_r2=0.96 - jitter, jaccard=0.95 + jitter
                )
            )
            ours = 0.96 if cosae_ahead else 0.5
            records.append(
                _record("cosae-all", fraction, seed, tr_r2=ours + jitter, jaccard=ours - jitter)
            )
            records.append(_record("sae_a", fraction, seed, tr_r2=0.9, jaccard=0.85))
            records.append(_record("usae", fraction, seed, tr_r2=0.92, jaccard=0.7))
    return records


def test_claims_follow_the_decision_rules():
    table = results_table(_fake_grid())
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

    behind = claims_table(results_table(_fake_grid(cosae_ahead=False))).set_index("claim_id")
    assert behind.loc["cosae_ahead", "verdict"] == "not supported"


def test_claims_on_a_partial_grid_say_not_tested():
    records = [r for r in _fake_grid() if r["variant"] in ("sae_a", "usae")]
    claims = claims_table(results_table(records)).set_index("claim_id")
    assert claims.loc["translation_not_consistency", "verdict"] == "not tested"
    assert claims.loc["cosae_ahead", "verdict"] == "not tested"
    assert claims.loc["distributional_fails_instance", "verdict"] == "not tested"


def test_real_runs_get_their_own_scope_and_summary_means():
    real = {
        "pair": "a__b__final",
        "runs": [
            _record("cosae-all", 1.0, 0, tr_r2=0.7, jaccard=0.6),
            _record("sae_a", 1.0, 0, tr_r2=0.6, jaccard=0.5),
        ],
    }
    table = results_table(_fake_grid(), [real])
    assert (table["data"] == "real").sum() == 2
    claims = claims_table(table)
    real_claims = claims[claims["scope"] == "real:a__b__final"].set_index("claim_id")
    assert real_claims.loc["cosae_ahead", "verdict"] == "supported"
    summary = summary_table(table)
    row = summary[(summary["variant"] == "cosae-translation") & (summary["paired_fraction"] == 1.0)]
    assert row["n_seeds"].item() == 3
    assert row["tr_r2"].item() == pytest.approx(0.952)
    assert row["jaccard_std"].item() == pytest.approx(0.002)


def test_figures_are_written(tmp_path):
    table = results_table(_fake_grid())
    table.to_csv(tmp_path / "alignment.csv", index=False)
    table = pd.read_csv(tmp_path / "alignment.csv")  # as the rule reads it: empty ablation -> NaN
    methods_figure(table, tmp_path / "m.png", tmp_path / "m.pdf")
    paired_fraction_figure(table, tmp_path / "f.png", tmp_path / "f.pdf")
    for name in ("m.png", "m.pdf", "f.png", "f.pdf"):
        assert (tmp_path / name).stat().st_size > 5000
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


def _two_methods(differences, metric="tr_intervention"):
    """cosae-all and usae at one fraction, cosae-all ahead by ``differences[seed]`` on M_tr."""
    records = []
    for seed, diff in enumerate(differences):
        records.append(_record("usae", 0.01, seed, tr_intervention=0.8, cont_intervention=0.5))
        records.append(
            _record("cosae-all", 0.01, seed, tr_intervention=0.8 + diff, cont_intervention=0.9)
        )
    return claims_table(results_table(records)).set_index("claim_id")


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
        records.append(_record("usae", 0.01, seed, tr_intervention=0.8, cont_intervention=0.5))
        records.append(
            _record("cosae-all", 0.01, seed, tr_intervention=0.8 + tr, cont_intervention=0.5 + cont)
        )
    claims = claims_table(results_table(records)).set_index("claim_id")
    assert claims.loc["cosae_ahead", "verdict"] == "not supported"


def test_anchoring_match_needs_every_seed_within_the_margin():
    records = []
    for seed, shortfall in enumerate((0.0, 0.01, 0.05)):
        records.append(_record("cosae-all", 1.0, seed, tr_intervention=0.9, cont_intervention=0.9))
        records.append(
            _record(
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


def test_cycle_proxy_is_judged_by_the_rank_correlation_interval():
    from repdiag.alignment.report import spearman_interval

    x = np.linspace(0, 1, 40)
    rho, low, _ = spearman_interval(x, x)
    assert rho == pytest.approx(1.0) and low == pytest.approx(1.0)
    faithful = [
        _record("usae", 0.01, seed, cycle_r2=v, tr_intervention=v, cont_intervention=0.5)
        for seed, v in enumerate(np.linspace(0.1, 0.9, 30))
    ]
    claims = claims_table(results_table(faithful)).set_index("claim_id")
    assert claims.loc["cycle_not_proxy", "verdict"] == "not supported"
    noise = np.random.default_rng(0).random(30)
    unfaithful = [
        _record("usae", 0.01, seed, cycle_r2=v, tr_intervention=w, cont_intervention=0.5)
        for seed, (v, w) in enumerate(zip(np.linspace(0.1, 0.9, 30), noise, strict=True))
    ]
    claims = claims_table(results_table(unfaithful)).set_index("claim_id")
    assert claims.loc["cycle_not_proxy", "verdict"] == "supported"
    assert "bootstrap interval" in claims.loc["cycle_not_proxy", "evidence"]


def test_presets_set_the_testbed_and_keep_the_easy_one():
    alignment = _config()["alignment"]
    assert alignment["preset"] == "easy"
    easy = cell_params(alignment, "cosae-all__p1__s0")
    assert easy["synthetic"]["n_specific"] == 0
    assert easy["synthetic"]["frequency_exponent"] == 0.0
    assert easy["sae"]["n_latents"] == 32 and easy["sae"]["k"] == 3
    hard = cell_params({**alignment, "preset": "hard"}, "cosae-all__p1__s0")
    assert hard["synthetic"]["n_specific"] == 4 and hard["synthetic"]["correlation"] == 0.5
    assert hard["synthetic"]["frequency_exponent"] == 1.0 and hard["synthetic"]["k_active"] == 4
    assert hard["sae"]["n_latents"] == 96 and hard["sae"]["k"] == 6
    # the preset's keys win; the rest of the section is kept
    assert hard["synthetic"]["n_train"] == easy["synthetic"]["n_train"]
    written = {**alignment, "preset": "none"}
    written["synthetic"] = {**alignment["synthetic"], "n_specific": 2}
    assert cell_params(written, "cosae-all__p1__s0")["synthetic"]["n_specific"] == 2
    with pytest.raises(ConfigError, match="k_active=5 exceeds the 4 concepts"):
        check_alignment_config(
            _config(
                {"preset": "none", "synthetic": {"n_concepts": 2, "n_specific": 1, "k_active": 5}}
            )
        )

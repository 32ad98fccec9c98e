"""Grid cells, per-job params, config checks and presets of the alignment study."""

from __future__ import annotations

import copy

import pytest
import yaml

from repdiag.alignment.grid import (
    cell_params,
    check_alignment_config,
    grid_cells,
    real_pairs,
    real_params,
    split_variant,
)
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
    assert params["pair"] == {"a": "barlow_twins", "b": "clip", "layer": "final", "control": "none"}
    assert params["weights"]["sae_a"] is None
    assert params["weights"]["cosae-translation"] == {"reconstruction": 1.0, "translation": 1.0}
    # each seed: its own split, attribute fit and SAE init; intervals over held-out rows
    assert params["seeds"] == [0, 1, 2] and "seed" not in params
    assert params["bootstrap"] == {"resamples": 1000, "confidence": 0.95}
    assert params["decodable_accuracy"] == 0.7
    assert params["sae"] == {
        "n_latents": 256,
        "k": 16,
        "aux_k": 64,
        "aux_coef": 0.03125,
        "dead_after": 4096,
    }


def test_a_rotation_control_pairs_a_model_with_itself_under_its_own_name():
    control = {"a": "mae", "b": "mae", "control": "rotation"}
    config = _config({"real": {"pairs": [{"a": "mae", "b": "clip"}, control]}})
    check_alignment_config(config)
    assert list(real_pairs(config["alignment"])) == [
        "mae__clip__final",
        "mae__mae__final__rotation",
    ]
    params = real_params(config["alignment"], "mae__mae__final__rotation")
    assert params["pair"]["control"] == "rotation"


def test_a_shuffle_control_is_accepted_beside_the_rotation_and_kept_out_of_the_claims():
    from repdiag.alignment.report import claims_table, results_table

    pairs = [
        {"a": "mae", "b": "mae", "control": "rotation"},
        {"a": "mae", "b": "mae", "control": "shuffle"},
    ]
    config = _config({"real": {"pairs": pairs}})
    check_alignment_config(config)
    assert list(real_pairs(config["alignment"])) == [
        "mae__mae__final__rotation",
        "mae__mae__final__shuffle",
    ]
    summary = dict.fromkeys(("tr_intervention", "cont_intervention"), 0.5)
    run = {"variant": "cosae-all", "method": "cosae", "ablation": "all", "paired_fraction": 1.0}
    run |= {"n_paired": 10, "seed": 0, "summary": summary}
    jobs = [
        {"pair": name, "control": pair["control"], "runs": [run]}
        for name, pair in zip(real_pairs(config["alignment"]), pairs, strict=True)
    ]
    table = results_table([], jobs)
    assert set(table["control"]) == {"rotation", "shuffle"}
    claims = claims_table(table)
    assert not claims["scope"].str.startswith("real:").any()


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

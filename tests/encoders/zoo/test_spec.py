"""The zoo config: which runs train, what each depends on, and errors that name the key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from repdiag.core.config import load_config
from repdiag.core.errors import ConfigError
from repdiag.encoders.zoo.spec import FAMILIES, check_zoo_config, run_spec, zoo_runs
from tests.encoders.zoo.conftest import tiny_config

REPO = Path(__file__).resolve().parents[3]


def test_shipped_configs_train_every_objective():
    config = load_config(REPO / "config/config.yaml")
    objectives = {run_spec(config, run)["objective"] for run in zoo_runs(config)}
    assert objectives == set(FAMILIES)  # masked modelling: simmim on the ConvNet, mae on the ViT
    mae = [run for run in zoo_runs(config) if run_spec(config, run)["objective"] == "mae"]
    assert {run_spec(config, run)["backbone"] for run in mae} == {"vit"}  # binding_families
    # the test config keeps the objectives whose outputs workflow tests read (mae on its ViT);
    # every objective trains in tests/encoders/zoo/test_learning.py
    test = load_config(REPO / "config" / "test.yaml")
    assert {run_spec(test, run)["objective"] for run in zoo_runs(test)} < set(FAMILIES)
    default = load_config(REPO / "config/config.yaml")
    assert run_spec(default, "supervised_s0")["timm_model"] == "resnet10t"
    assert run_spec(default, "simmim_s0")["image_size"] == 64


def test_only_runs_used_by_zoo_models_are_trained():
    config = tiny_config()
    assert zoo_runs(config) == sorted(FAMILIES)  # supervised_resnet is defined but unused
    config["models"] = {"a": {"source": "timm", "id": "resnet18", "family": "supervised"}}
    assert zoo_runs(config) == []


def test_run_spec_merges_objective_defaults_and_run_overrides():
    config = tiny_config()
    config["zoo"]["objectives"]["simclr"]["hparams"] = {"temperature": 0.5}
    spec = run_spec(config, "simclr")
    assert spec["hparams"] == {"projector_dims": [64, 32], "temperature": 0.5}
    assert spec["family"] == "contrastive" and spec["steps"] == 4
    assert config["zoo"]["hparams"]["simclr"]["temperature"] == 0.2  # not mutated
    resnet = run_spec(config, "supervised_resnet")
    assert resnet["objective"] == "supervised" and resnet["timm_model"] == "resnet10t"


def edit(change):
    config = tiny_config()
    change(config)
    return config


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["models"]["mae"].update(id="nope"), r"models\.mae\.id: zoo run 'nope' is not defined"),
        (lambda c: c["models"]["mae"].update(family="contrastive"), r"models\.mae\.family: .*set family: masked_modeling"),
        (lambda c: c["zoo"]["objectives"]["mae"].update(steps=0), r"models\.mae\.family: .*steps: 0 .*set family: control"),
        (lambda c: c["models"]["mae"].update(family="control"), r"models\.mae\.family: .*set family: masked_modeling"),
        (lambda c: c["zoo"]["objectives"].update(byol={}), r"zoo\.objectives\.byol: the run name is not an objective"),
        (lambda c: c["zoo"]["objectives"]["dino"].update(backbone="convnext"), r"zoo\.objectives\.dino\.backbone: 'convnext'"),
        (lambda c: c["zoo"]["objectives"]["mae"].update(backbone="resnet"), r"zoo\.objectives\.mae\.backbone: mae .* needs a ViT"),
        (lambda c: c["zoo"]["objectives"]["dino"].update(hparams={"tau": 1}), r"zoo\.objectives\.dino\.hparams\.tau: unknown hyperparameter"),
        (lambda c: c["zoo"]["objectives"]["mae"].update(hparams={"norm_pix_loss": 1}), r"hparams\.norm_pix_loss: expected bool"),
        (lambda c: c["zoo"]["objectives"]["clip"].update(hparams={"embed_dim": "64"}), r"hparams\.embed_dim: expected int"),
        (lambda c: c["zoo"]["objectives"]["mae"].update(hparams={"decoder_heads": 3}), r"zoo\.objectives\.mae: decoder_dim \(32\) must be a multiple of decoder_heads \(3\)"),
        (lambda c: c["zoo"]["hparams"]["mae"].update(decoder_dim=30, decoder_heads=1), r"decoder_dim \(30\) must be a multiple of 4"),
        (lambda c: c["zoo"]["hparams"]["clip"].update(text_heads=5), r"zoo\.objectives\.clip: text_width \(32\) must be a multiple of text_heads \(5\)"),
        (lambda c: c["zoo"]["scenes"].update(max_objects=5), r"zoo\.scenes: need min_objects <= max_objects <= rows \* cols = 4"),
        (lambda c: c["zoo"]["scenes"].update(object_size=0.95), r"zoo\.scenes\.object_size \* \(1 \+ zoo\.scenes\.jitter\.scale\)"),
        (lambda c: c["zoo"]["objectives"]["supervised"].update(hparams={"label": "slot_shape", "slot_weight": 0.1}), r"zoo\.objectives\.supervised\.hparams\.slot_weight: .*set label: shape_presence"),
        (lambda c: c["zoo"]["objectives"]["supervised"].update(hparams={"slot_weight": 0.1}), r"models\.supervised\.family: .*slot labels at a dose.*set family: binding_dose"),
        (lambda c: c["zoo"]["objectives"]["simclr"].update(stop_at=5), r"zoo\.objectives\.simclr\.stop_at: 5 is past the run's steps \(4\)"),
    ],
)  # fmt: skip
def test_semantic_errors_name_the_key(change, message):
    with pytest.raises(ConfigError, match=message):
        check_zoo_config(edit(change))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"depth": "two"}, r"zoo\.backbones\.vit\.timm_kwargs\.depth: expected an integer or a list of integers, got 'two'"),
        ({"depth": True}, r"timm_kwargs\.depth: expected an integer"),
        ({"mlp_ratio": "2"}, r"zoo\.backbones\.vit\.timm_kwargs\.mlp_ratio: expected a number \(or null\), got '2'"),
        ({"class_token": "yes"}, r"timm_kwargs\.class_token: expected true or false"),
        ({"img_size": [32, "32"]}, r"timm_kwargs\.img_size: expected an integer or a list"),
    ],
)  # fmt: skip
def test_timm_kwargs_of_the_wrong_type_are_refused_naming_the_key(kwargs, message):
    """Issue 36, case 10: checked on every parse, without importing timm."""
    config = tiny_config()
    config["zoo"]["backbones"]["vit"]["timm_kwargs"].update(kwargs)
    with pytest.raises(ConfigError, match=message):
        check_zoo_config(config)


def test_timm_kwargs_of_the_right_types_pass():
    config = tiny_config()
    config["zoo"]["backbones"]["vit"]["timm_kwargs"].update(
        img_size=[32, 32], drop_path_rate=0, init_values=None, class_token=True, global_pool="token"
    )
    check_zoo_config(config)


def test_valid_config_passes_and_is_not_mutated():
    config = tiny_config()
    before = copy.deepcopy(config)
    check_zoo_config(config)
    assert config == before


def test_dose_series_families_and_doses():
    from repdiag.encoders.zoo.spec import binding_dose

    config = tiny_config()
    config["zoo"]["objectives"]["dose"] = {
        **config["zoo"]["objectives"]["supervised"],
        "objective": "supervised",
        "hparams": {"slot_weight": 0.3},
    }
    config["models"]["dose"] = {"source": "zoo", "id": "dose", "family": "binding_dose"}
    check_zoo_config(config)
    assert run_spec(config, "dose")["family"] == "binding_dose"
    assert run_spec(config, "supervised")["family"] == "supervised"
    assert binding_dose("supervised", {"label": "shape_presence", "slot_weight": 0.3}) == 0.3
    assert binding_dose("supervised", {"label": "shape_presence"}) == 0.0
    assert binding_dose("simclr", {"slot_weight": 0.3}) == 0.0


def test_a_saved_step_is_trained_by_its_run():
    """A model of step 2 of simclr: simclr is trained (and saves), the step is copied out."""
    from repdiag.core.config import fill_defaults
    from repdiag.encoders.zoo.spec import saved_parent, saved_runs, saving_runs, trained_runs

    config = tiny_config()
    config["zoo"]["objectives"]["simclr"]["save_at"] = [2]
    config["models"] = {"step2": {"source": "zoo", "id": "simclr-step2", "family": "contrastive"},
                        "clip": config["models"]["clip"]}  # fmt: skip
    fill_defaults(config)
    check_zoo_config(config)
    assert zoo_runs(config) == ["clip", "simclr-step2"]
    assert trained_runs(config) == ["clip", "simclr"]
    assert saving_runs(config) == ["simclr"] and saved_runs(config) == ["simclr-step2"]
    assert saved_parent(config, "simclr-step2") == "simclr" and saved_parent(config, "clip") is None


def test_zoo_runs_are_counted_once_per_run() -> None:
    from repdiag.encoders.zoo.spec import zoo_runs, zoo_runs_of

    models = {
        "a": {"source": "zoo", "id": "run1"},
        "b": {"source": "zoo", "id": "run1"},
        "c": {"source": "zoo", "id": "run0"},
        "d": {"source": "timm", "name": "resnet18"},
    }
    assert zoo_runs_of(models) == ["run0", "run1"]
    assert zoo_runs({"models": models}) == zoo_runs_of(models)


def test_zoo_models_and_their_files_keep_the_order_scripts_pair_them_in() -> None:
    from repdiag.encoders.zoo.spec import zoo_files, zoo_models_of

    models = {
        "b": {"source": "zoo", "id": "run1"},
        "a": {"source": "zoo", "id": "run1"},
        "t": {"source": "timm", "id": "resnet18"},
        "c": {"source": "zoo", "id": "run0"},
    }
    assert zoo_models_of(models) == ["a", "b", "c"]
    assert zoo_files(models, ["c", "t", "a", "b"], "meta.json") == [
        "results/zoo/run0/meta.json",
        "results/zoo/run1/meta.json",
        "results/zoo/run1/meta.json",
    ]

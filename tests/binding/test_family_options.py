"""binding_families: the objectives x seeds of each compared series, at one budget, apart from
the main study and from the JER intervention."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from repdiag.binding.family_options import (
    check_family_config,
    family_cells,
    family_members,
    family_models,
)
from repdiag.core.config import fill_defaults, load_config
from repdiag.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def raw_test_config() -> dict:
    """config/test.yaml as written, plus the workflow tests' family series and causal base."""
    from tests.workflow.test_on_request_targets import add_on_request_paths

    config = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    add_on_request_paths(config)
    return config


def resolved(raw: dict) -> dict:
    return fill_defaults(copy.deepcopy(raw))


def test_the_test_series_names_two_objectives_x_two_seeds() -> None:
    config = resolved(raw_test_config())
    check_family_config(config)
    cells = [(c["objective"], c["seed"], c["model"]) for c in family_cells(config)]
    assert cells == [
        ("simclr", 0, "simclr"),  # seed 0 is the test config's own run (existing)
        ("simclr", 1, "simclr_fam_s1"),
        ("supervised", 0, "supervised"),
        ("supervised", 1, "supervised_fam_s1"),
    ]
    assert config["zoo"]["objectives"]["supervised_fam_s1"]["objective"] == "supervised"
    assert config["models"]["supervised_fam_s1"]["family"] == "supervised"
    assert config["models"]["simclr_fam_s1"]["family"] == "contrastive"
    # config/test.yaml has no controls: the members are the compared runs; the two existing
    # runs stay the main study's
    assert family_members(config) == sorted(c[2] for c in cells)
    assert family_models(config) == ["simclr_fam_s1", "supervised_fam_s1"]
    assert family_models(load_config(REPO / "config" / "test.yaml")) == []
    assert family_members(load_config(REPO / "config" / "test.yaml")) == []


def test_the_default_compares_seven_objectives_on_two_backbones_with_saved_steps():
    """The second design (docs/binding.md): the seven objectives at 3000 steps on the ResNet
    (3 seeds, SimMIM its masked modelling) and the ViT (1 seed, MAE), each run saving step 1000,
    with the controls."""
    config = load_config(REPO / "config/config.yaml")
    check_family_config(config)
    cells = family_cells(config)
    finals = [c for c in cells if "saved_by" not in c]
    common = {"barlow_twins", "vicreg", "dino", "simclr", "clip", "supervised"}
    runs = config["zoo"]["objectives"]
    backbone = {c["run"]: runs[c["run"]]["backbone"] for c in finals}
    resnet = sorted((c["objective"], c["seed"]) for c in finals if backbone[c["run"]] == "resnet")
    vit = sorted((c["objective"], c["seed"]) for c in finals if backbone[c["run"]] == "vit")
    assert resnet == sorted((o, s) for o in common | {"simmim"} for s in (0, 1, 2))
    assert vit == sorted((o, 0) for o in common | {"mae"})
    for cell in finals:
        run = runs[cell["run"]]
        assert (run["objective"], run["seed"]) == (cell["objective"], cell["seed"])
        assert (run["steps"], run["batch_size"], run["save_at"]) == (3000, 32, [1000])
        if cell["objective"] != "mae":  # each objective's family, as in the main study's runs
            assert (
                config["models"][cell["model"]]["family"]
                == config["models"][f"{cell['objective']}_s0"]["family"]
            )
    saved = {c["model"]: c["saved_by"] for c in cells if "saved_by" in c}
    assert saved == {f"{c['run']}-step1000": c["run"] for c in finals}
    for child, parent in saved.items():
        assert runs[child]["stop_at"] == 1000 and runs[child]["saved_by"] == parent
        assert config["models"][child]["family"] == config["models"][parent]["family"]
    controls = {k for k, e in config["models"].items() if e["family"] == "control"}
    assert len(controls) == 8
    assert set(family_members(config)) == set(family_models(config)) | controls
    assert len(family_models(config)) == 2 * (21 + 7)


def with_series(**changes) -> dict:
    raw = raw_test_config()
    for dotted, value in changes.items():
        node = raw["series"]["fam"]
        *path, last = dotted.split("__")
        for key in path:
            node = node[key]
        node[last] = value
    return raw


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {**raw_test_config(), "binding_families": {"series": ["nope"]}},
            "'nope' is not a series",
        ),
        (with_series(axes__lr={"set": "lr", "values": [0.1]}), "exactly the axes"),
        (
            with_series(axes__objective__families={"simclr": "control", "supervised": "control"}),
            "kept out of every comparison",
        ),
    ],
    ids=["unknown series", "an extra axis", "an apart family"],
)
def test_a_bad_family_series_is_refused_naming_the_key(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_family_config(resolved(raw))


def test_runs_at_two_budgets_are_refused() -> None:
    config = resolved(raw_test_config())
    config["zoo"]["objectives"]["supervised_fam_s1"]["steps"] = 4
    with pytest.raises(ConfigError, match=r"series\.fam: runs .* have steps 3 and 4"):
        check_family_config(config)


def test_a_run_both_compared_and_regularised_is_refused() -> None:
    raw = raw_test_config()
    raw["series"]["fam"]["existing"]["simclr_fam_s0"] = "jer_raise_s0"
    with pytest.raises(ConfigError, match=r"\['jer_raise_s0'\] are also arms of the JER"):
        check_family_config(resolved(raw))


def test_saved_steps_of_compared_runs_are_members_nested_in_their_run() -> None:
    """A compared run's `save_at` steps are models of the comparison (built by binding_families,
    not by the main study), each recorded with the run that saved it."""
    raw = raw_test_config()
    raw["series"]["fam"]["run"]["save_at"] = [1]
    config = resolved(raw)
    check_family_config(config)
    saved = [c for c in family_cells(config) if "saved_by" in c]
    assert [(c["model"], c["saved_by"], c["declared"]) for c in saved] == [
        ("simclr_fam_s1-step1", "simclr_fam_s1", True),
        ("supervised_fam_s1-step1", "supervised_fam_s1", True),
    ]
    assert {"simclr_fam_s1-step1", "supervised_fam_s1-step1"} <= set(family_models(config))
    assert {"simclr_fam_s1-step1", "supervised_fam_s1-step1"} <= set(family_members(config))
    from repdiag.binding.outputs import binding_models

    assert not {"simclr_fam_s1-step1", "supervised_fam_s1-step1"} & set(binding_models(config))

"""binding_causal: the arms of each base per seed, equal apart from the JER term at one strength."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from repdiag.binding.causal_options import (
    calibration_runs,
    causal_cells,
    causal_members,
    causal_models,
    check_causal_config,
)
from repdiag.core.config import fill_defaults, load_config
from repdiag.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def raw_test_config() -> dict:
    """config/test.yaml as written, plus the workflow tests' causal base (add_jer_up)."""
    from tests.workflow.test_on_request_targets import add_jer_up

    config = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    add_jer_up(config)
    return config


def resolved(raw: dict) -> dict:
    return fill_defaults(copy.deepcopy(raw))


def test_the_test_base_passes_and_names_its_arms() -> None:
    config = resolved(raw_test_config())
    check_causal_config(config)
    cells = [(c["arm"], c["seed"], c["model"]) for c in causal_cells(config)]
    assert cells == [
        ("plain", 0, "simclr"),
        ("raise", 0, "jer_raise_s0"),
        ("sham", 0, "jer_sham_s0"),
    ]
    assert causal_models(config) == ["jer_raise_s0", "jer_sham_s0"]
    assert causal_members(config) == ["jer_raise_s0", "jer_sham_s0", "simclr"]
    assert calibration_runs(config) == ["jer_raise_s0"]
    assert causal_models(load_config(REPO / "config" / "test.yaml")) == []


def test_the_default_declares_four_arms_x_four_seeds_on_two_dose_bases() -> None:
    config = load_config(REPO / "config/config.yaml")
    check_causal_config(config)
    cells = causal_cells(config)
    assert {c["base"] for c in cells} == {"causal_0p3", "causal_1"}
    assert {(c["base"], c["dose"]) for c in cells} == {("causal_0p3", 0.3), ("causal_1", 1.0)}
    for base in ("causal_0p3", "causal_1"):
        arms = [(c["arm"], c["seed"]) for c in cells if c["base"] == base]
        assert sorted(arms) == sorted(
            (a, s) for a in ("plain", "raise", "lower", "sham") for s in range(4)
        )
    plain = {c["model"] for c in cells if c["arm"] == "plain"}
    assert plain == {f"dose_{d}_s{s}" for d in ("0p3", "1") for s in range(4)}  # trained once
    assert len(causal_models(config)) == 24 and not plain & set(causal_models(config))
    assert calibration_runs(config) == ["causal_0p3_raise_s0", "causal_1_raise_s0"]
    runs = config["zoo"]["objectives"]
    for base in ("causal_0p3", "causal_1"):
        weights = {
            arm: runs[f"{base}_{arm}_s2"]["jer_regulariser"] for arm in ("raise", "lower", "sham")
        }
        w = weights["raise"]["weight"]
        assert w > 0 and weights["lower"]["weight"] == -w
        assert weights["sham"]["weight"] == w and weights["sham"]["sham"] is True


def test_no_section_is_no_arm() -> None:
    assert causal_cells({"models": {}}) == [] and causal_models({}) == []


def arm_patch(raw: dict, arm: str) -> dict:
    return raw["series"]["jer"]["axes"]["arm"]["patches"][arm]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["binding_causal"].update(series=["nope"]), "'nope' is not a series"),
        (lambda c: arm_patch(c, "raise").update(lr=0.01), r"differ in \['lr'\]"),
        (
            lambda c: arm_patch(c, "raise")["jer_regulariser"].update(weight=-0.5),
            "raise weight > 0",
        ),
        (lambda c: arm_patch(c, "sham")["jer_regulariser"].pop("sham"), "sham: true"),
        (
            lambda c: arm_patch(c, "sham")["jer_regulariser"].update(weight=0.2),
            r"\|weight\| \[0.2, 0.5\]",
        ),
        (lambda c: c["series"]["jer"]["axes"]["arm"]["patches"].pop("sham"), "needs plain, sham"),
        (
            lambda c: c["series"]["jer"]["axes"]["arm"]["patches"].update(extra={}),
            "unknown arm 'extra'",
        ),
        (
            lambda c: c["zoo"]["objectives"]["simclr"].update(jer_regulariser={"weight": 0.1}),
            "plain has weight 0",
        ),
        (
            lambda c: c["series"]["jer"]["axes"].update(
                seeds=c["series"]["jer"]["axes"].pop("seed")
            ),
            "a `seed` axis",
        ),
    ],
)
def test_arms_that_manipulate_more_than_the_jer_term_are_refused(change, message) -> None:
    raw = raw_test_config()
    change(raw)
    if "seeds" in raw["series"]["jer"]["axes"]:
        raw["series"]["jer"]["name"] = "jer_{arm}_s{seeds}"
    with pytest.raises(ConfigError, match=message) as error:
        check_causal_config(resolved(raw))
    assert "series" in str(error.value)

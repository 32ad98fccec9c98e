"""binding_causal: the arms of each base per seed, equal apart from the push, each with the term
and sign of its arm."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from repdiag.binding.causal.options import (
    calibration_runs,
    causal_cells,
    causal_members,
    causal_models,
    check_causal_config,
)
from repdiag.core.config import fill_defaults, load_config
from repdiag.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


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
        ("null", 0, "jer_null_s0"),
    ]
    # the plain arm names an existing run (simclr): only the arms' own runs are on request
    assert causal_models(config) == ["jer_null_s0", "jer_raise_s0", "jer_sham_s0"]
    assert causal_members(config) == ["jer_null_s0", "jer_raise_s0", "jer_sham_s0", "simclr"]
    assert calibration_runs(config) == ["jer_raise_s0"]
    assert causal_models(load_config(REPO / "config" / "test.yaml")) == []


def test_the_default_declares_six_arms_x_ten_seeds_on_one_base_all_trained_on_request() -> None:
    config = load_config(REPO / "config/config.yaml")
    check_causal_config(config)
    cells = causal_cells(config)
    assert {(c["base"], c["dose"]) for c in cells} == {("causal_0p3", 0.3)}
    arms = sorted((c["arm"], c["seed"]) for c in cells)
    assert arms == sorted(
        (a, s) for a in ("plain", "raise", "lower", "sham", "geometry", "null") for s in range(10)
    )
    # every arm, plain included, is the target's own run: trained together, on one machine
    assert len(causal_models(config)) == 60 == len(causal_members(config))
    assert calibration_runs(config) == ["causal_0p3_raise_s0"]
    runs = config["zoo"]["objectives"]
    regulariser = {
        arm: runs[f"causal_0p3_{arm}_s2"].get("jer_regulariser") or {}
        for arm in ("plain", "raise", "lower", "sham", "geometry", "null")
    }
    w = regulariser["raise"]["weight"]
    assert w > 0 and regulariser["raise"].get("term", "jer") == "jer"
    assert -w < regulariser["lower"]["weight"] < 0  # gentler
    assert (regulariser["sham"]["weight"], regulariser["sham"]["term"]) == (w, "direction_sham")
    assert regulariser["geometry"]["term"] == "global_pr" and regulariser["geometry"]["weight"] > 0
    assert 0 < regulariser["null"]["weight"] <= 1e-6 and regulariser["plain"]["weight"] == 0.0


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
            "raise term jer and weight > 0",
        ),
        (
            lambda c: arm_patch(c, "sham")["jer_regulariser"].pop("term"),
            "sham term direction_sham",
        ),
        (
            lambda c: arm_patch(c, "sham")["jer_regulariser"].update(weight=0.2),
            "the sham's weight 0.2 is not the raise arm's 0.5",
        ),
        (
            lambda c: arm_patch(c, "null")["jer_regulariser"].update(weight=0.01),
            r"null 0 < \|weight\| <= 1e-06",
        ),
        (lambda c: c["series"]["jer"]["axes"]["arm"]["patches"].pop("null"), r"lacks \['null'\]"),
        (
            lambda c: c["series"]["jer"]["axes"]["arm"]["patches"].update(
                lower={"jer_regulariser": {"weight": -0.9, "images": 2, "probes": 1}}
            ),
            "exceeds the raise arm's",
        ),
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

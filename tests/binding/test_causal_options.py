"""binding_causal.comparisons: each regularised run against the same run without the regulariser."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from repdiag.binding.causal_options import causal_models, check_causal_config, comparisons
from repdiag.core.config import load_config
from repdiag.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def test_config() -> dict:
    """config/test.yaml plus the workflow tests' regularised model (add_jer_up)."""
    from tests.workflow.test_on_request_targets import add_jer_up

    config = load_config(REPO / "config" / "test.yaml")
    add_jer_up(config)
    return config


def edited(config: dict, change) -> dict:
    config = copy.deepcopy(config)
    change(config)
    return config


def test_shipped_configs_pass_and_name_their_comparisons(test_config) -> None:
    check_causal_config(test_config)
    assert comparisons(test_config) == {"jer_up": "simclr"}
    assert comparisons(load_config(REPO / "config" / "test.yaml")) == {}
    default = load_config(REPO / "config.yaml")
    check_causal_config(default)
    pairs = comparisons(default)
    assert len(pairs) == 16 and set(pairs.values()) == {
        "simclr_s0",
        "simclr_s1",
        "dose_0p1_s0",
        "dose_0p1_s1",
    }
    assert causal_models(default) == sorted(pairs)


def test_no_section_is_no_comparison() -> None:
    assert comparisons({"models": {}}) == {} and causal_models({}) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["binding_causal"]["comparisons"].update(jer_up="nope"), "'nope' is not in"),
        (
            lambda c: c["zoo"]["objectives"]["jer_up"].update(lr=0.01),
            r"differ in \['lr'\]",
        ),
        (
            lambda c: c["zoo"]["objectives"]["jer_up"]["jer_regulariser"].update(weight=0.0),
            "has no JER regulariser",
        ),
        (
            lambda c: c["zoo"]["objectives"]["simclr"].update(jer_regulariser={"weight": 0.1}),
            "regularised itself",
        ),
        (lambda c: c["models"]["jer_up"].update(family="contrastive"), "family 'jer_intervention'"),
        (
            lambda c: c["binding_causal"]["comparisons"].update(simclr="jer_up"),
            "is also a baseline",
        ),
        (
            lambda c: (
                c["models"].update(ext={"source": "timm", "id": "resnet18", "family": "supervised"})
                or c["binding_causal"]["comparisons"].update(jer_up="ext")
            ),
            "source 'timm'",
        ),
    ],
)
def test_a_comparison_that_manipulates_more_than_the_jer_is_refused(
    test_config, change, message
) -> None:
    config = edited(test_config, change)
    with pytest.raises(ConfigError, match=message) as error:
        check_causal_config(config)
    assert "binding_causal.comparisons" in str(error.value) or "models." in str(error.value)

"""Pre-run checks of the binding config that need built models (repdiag.binding.prerun)."""

from __future__ import annotations

import sys

import pytest

from repdiag.binding import prerun
from repdiag.core.errors import ConfigError
from tests.encoders.zoo.conftest import tiny_config


def test_jacobian_layers_every_checked_model_lacks_are_refused_before_a_run():
    """Issue 36, case 10: zoo and library models built on meta; python entries (user code) and
    models that cannot be built here are left to their jobs."""
    config = tiny_config()
    config["models"] = {
        "mae": config["models"]["mae"],
        "rn": {
            "source": "timm",
            "id": "resnet10t",
            "family": "supervised",
            "pooling": "mean",
            "kwargs": {"num_classes": 0},  # headless: no head tap
        },
        "ctrl": {"source": "python", "id": "no_such_module:f", "family": "control"},
    }
    config["jacobians"] = {"layers": ["block01", "final"]}
    with pytest.raises(
        ConfigError,
        match=r"jacobians\.layers: 'block01' not among the taps of model 'rn' \(timm resnet10t\): "
        r"stage0, stage1, stage2, stage3, final;",
    ):
        prerun.check_jacobian_layers(config)
    prerun.check_jacobian_layers(config, models={"mae", "ctrl"})  # a 2-block ViT: block01 is one
    config["jacobians"] = {"layers": ["block02"]}
    with pytest.raises(ConfigError, match=r"'block02' not among the taps of model 'mae'"):
        prerun.check_jacobian_layers(config, models={"mae"})
    config["jacobians"] = {"layers": ["final"]}
    prerun.check_jacobian_layers(config)
    config["models"]["odd"] = {"source": "timm", "id": "not_a_model", "family": "other"}
    config["jacobians"] = {"layers": ["head"]}
    with pytest.raises(ConfigError, match=r"'head' not among the taps of model 'rn'"):
        prerun.check_jacobian_layers(config, models={"odd", "rn"})  # 'odd': its job reports it


def test_nothing_is_built_without_layers_or_checkable_models(monkeypatch):
    """The encoder factory (torch, model builders) is imported only when there is something to
    check."""
    monkeypatch.setitem(sys.modules, "repdiag.encoders.factory", None)  # importing it would fail
    config = tiny_config()
    prerun.check_jacobian_layers({**config, "jacobians": {"layers": []}})
    python_only = {"c": {"source": "python", "id": "m:f", "family": "control"}}
    prerun.check_jacobian_layers({"models": python_only, "jacobians": {"layers": ["block09"]}})
    prerun.check_jacobian_layers({**config, "jacobians": {"layers": ["block09"]}}, models=set())

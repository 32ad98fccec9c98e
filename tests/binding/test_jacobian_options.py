"""Jacobian options: schema defaults and cross-key checks (repdiag.binding.jacobian_options)."""

from __future__ import annotations

import pytest
import torch

from repdiag.binding.jacobian_options import check_jacobians_config
from repdiag.core.config import fill_defaults
from repdiag.core.errors import ConfigError

torch.set_num_threads(1)


def test_config_defaults_and_semantic_checks():
    filled = fill_defaults({"jacobians": {}})["jacobians"]
    assert filled["method"] == "auto" and filled["k"] == 32 and filled["power_iters"] == 5
    assert filled["precision"] == "fp32"  # full float32 unless asked otherwise
    assert filled["probes"] == {
        "binding": {"n": 16},
        "noise": {"n": 8, "std": 0.25},
        "folder": {"path": None, "n": 16},
    }
    check_jacobians_config({"jacobians": filled, "datasets": {"binding": {"n_queries": 16}}})
    with pytest.raises(
        ConfigError,
        match=r"jacobians\.probes\.binding\.n = 16 exceeds datasets\.binding\.n_queries = 8",
    ):
        check_jacobians_config({"jacobians": filled, "datasets": {"binding": {"n_queries": 8}}})
    empty = fill_defaults({"jacobians": {"probes": {"binding": {"n": 0}, "noise": {"n": 0}}}})
    with pytest.raises(ConfigError, match="every probe set is empty"):
        check_jacobians_config(empty)


@pytest.mark.parametrize("name", ["nonexistent_layer", "block5", "Final", "stage", "layer4"])
def test_a_layer_name_no_encoder_has_is_refused_naming_the_key(name):
    """Issue 36, case 10: taps are named by repdiag.encoders.taps only."""
    config = fill_defaults({"jacobians": {"layers": ["final", name]}})
    with pytest.raises(ConfigError, match=rf"jacobians\.layers\[1\]: '{name}' is not a tap any"):
        check_jacobians_config(config)


def test_the_tap_name_pattern_admits_every_name_the_taps_give():
    import timm

    from repdiag.binding.jacobian_options import TAP_NAME
    from repdiag.encoders.taps import tap_plan

    config = fill_defaults({"jacobians": {"layers": ["block00", "block123", "stage3", "head"]}})
    check_jacobians_config(config)
    with torch.device("meta"):
        vit = timm.create_model("vit_tiny_patch16_224", depth=2, embed_dim=32, num_heads=2)
        resnet = timm.create_model("resnet10t", num_classes=0)
    for model in (vit, resnet):
        layers = tap_plan(model).layers if model is vit else tap_plan(model, "mean").layers
        assert all(TAP_NAME.match(name) for name in layers), layers

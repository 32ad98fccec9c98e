"""What the source builders share (repdiag.encoders.sources.base): the registry, the meta-device
mode's default device, close names."""

from __future__ import annotations

import torch

from repdiag.encoders import SOURCES
from repdiag.encoders.sources.base import BuildOptions, close_names


def test_registry_lists_every_source():
    assert SOURCES.names() == sorted(
        ["timm", "open_clip", "torchvision", "hub", "checkpoint", "zoo", "python"]
    )


def test_meta_mode_makes_every_new_tensor_a_shape_only(tmp_path):
    with BuildOptions(tmp_path, meta=True).device():
        made = torch.nn.Linear(4, 3)
    with BuildOptions(tmp_path).device():
        real = torch.nn.Linear(4, 3)
    assert made.weight.device.type == "meta" and made.weight.shape == (3, 4)
    assert real.weight.device.type == "cpu"


def test_close_names_suggest_the_nearest_spellings():
    assert close_names("resnet_18", ["resnet18", "resnet34", "vit"]) == (
        "; did you mean resnet18, resnet34?"
    )
    assert close_names("zzz", ["resnet18"]) == ""


def test_call_module_builder_names_the_model_the_call_and_a_wrong_result():
    import pytest
    from torch import nn

    from repdiag.core.errors import EncoderError
    from repdiag.encoders.sources.base import call_module_builder

    assert isinstance(
        call_module_builder("m", nn.Linear, {"in_features": 2, "out_features": 1}, "c", "n"),
        nn.Linear,
    )

    def broken(**kwargs):
        raise RuntimeError("boom")

    with pytest.raises(EncoderError, match=r"model 'm': f\(\) failed \(RuntimeError: boom\)"):
        call_module_builder("m", broken, {}, "f()", "f")
    with pytest.raises(EncoderError, match=r"model 'm': f returned int, not an nn.Module"):
        call_module_builder("m", lambda: 3, {}, "f()", "f")

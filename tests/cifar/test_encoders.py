"""Encoders of the CIFAR study: one output width, the 32 px ResNet-18, 4x4-patch ViT, pixel MLP."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch
import yaml
from torch import nn

from repdiag.cifar.encoders import (
    ARCHITECTURES,
    build_cifar_encoder,
    build_simclr_model,
    output_width,
    parameter_count,
    resnet18_32px,
)
from repdiag.cifar.study import ARCHITECTURE_NAMES
from repdiag.cifar.train import extract_features
from repdiag.cifar.views import eval_transform
from repdiag.core.errors import ConfigError, RegistryError

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "cifar.schema.yaml"
SMALL = {
    "resnet18": {"width": 4, "lr": 0.5},  # lr is a training setting, not a constructor argument
    "vit": {"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2, "mlp_ratio": 2.0},
    "mlp": {"hidden": [24]},
}


def test_registered_architectures_match_the_schema_and_the_study() -> None:
    schema = yaml.safe_load(SCHEMA.read_text())["properties"]["architectures"]["items"]["enum"]
    assert ARCHITECTURES.names() == sorted(schema) == sorted(ARCHITECTURE_NAMES)
    with pytest.raises(RegistryError, match="resnet18"):
        ARCHITECTURES.get("resnet50")


@pytest.mark.parametrize("architecture", ["resnet18", "vit", "mlp"])
@pytest.mark.parametrize("feature_dim", [32, 20])
def test_every_encoder_outputs_feature_dim(architecture: str, feature_dim: int) -> None:
    encoder = build_cifar_encoder(architecture, SMALL[architecture], feature_dim, 32)
    assert output_width(encoder, 32) == feature_dim


def test_resnet18_is_adapted_to_32_pixels() -> None:
    """3x3 stride-1 stem, no max-pool: a 32 px input leaves 4x4 maps after the last stage, and
    the parameters are timm's ResNet-18 minus its 7x7 stem plus a 3x3 one."""
    net = resnet18_32px(512, 32, width=64)  # timm's ResNet-18 widths
    assert isinstance(net.maxpool, nn.Identity)
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
    assert net.forward_features(torch.zeros(1, 3, 32, 32)).shape == (1, 512, 4, 4)
    reference = parameter_count(timm.create_model("resnet18", num_classes=0))
    assert parameter_count(net) == reference - 7 * 7 * 3 * 64 + 3 * 3 * 3 * 64
    # the stage widths scale with `width`; 8 w == feature_dim needs no extra map
    assert not isinstance(resnet18_32px(32, 32, width=4), nn.Sequential)
    assert isinstance(resnet18_32px(20, 32, width=4)[-1], nn.Linear)


def test_vit_uses_4x4_patches_and_mlp_flattened_pixels() -> None:
    vit = build_cifar_encoder("vit", SMALL["vit"], 32, 32)
    assert vit.patch_embed.proj.kernel_size == (4, 4) and vit.patch_embed.num_patches == 64
    mlp = build_cifar_encoder("mlp", SMALL["mlp"], 32, 32)
    assert mlp[1].in_features == 3 * 32 * 32
    with pytest.raises(ConfigError, match="patch_size"):
        build_cifar_encoder("vit", {**SMALL["vit"], "patch_size": 5}, 32, 32)
    with pytest.raises(ConfigError, match=r"cifar\.encoders\.mlp"):
        build_cifar_encoder("mlp", {"depth": 3}, 32, 32)


def test_probe_features_come_from_the_encoder_not_the_head() -> None:
    torch.manual_seed(0)
    model = build_simclr_model("mlp", SMALL["mlp"], 32, 16, 8, 32).eval()
    images = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    transform = eval_transform((0.5,) * 3, (0.25,) * 3)
    features = extract_features(model.encoder, images, transform, batch_size=4)
    with torch.no_grad():
        h, z = model(transform(images))
    assert features.shape == (6, 32) and z.shape == (6, 8)
    torch.testing.assert_close(torch.from_numpy(features), h)

"""Zoo backbones: complete timm kwargs, headless random-weight models, pooling and ViT tokens
(repdiag.encoders.zoo.backbones)."""

from __future__ import annotations

import pytest
import timm
import torch

from repdiag.core.errors import EncoderError
from repdiag.encoders.zoo.backbones import (
    backbone_kwargs,
    build_backbone,
    feature_dim,
    is_vit,
    memory_format,
    pooling,
    vit_encode_tokens,
    vit_patch_tokens,
)

VIT = {"patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}


def test_kwargs_add_headless_and_image_size_only_where_the_model_takes_it():
    vit = backbone_kwargs("vit_tiny_patch16_224", VIT, 32)
    assert vit == {"num_classes": 0, **VIT, "img_size": 32}
    resnet = backbone_kwargs("resnet10t", {"stem_width": 8}, 32)
    assert resnet == {"num_classes": 0, "stem_width": 8}  # a ResNet takes any size, no img_size
    given = backbone_kwargs("vit_tiny_patch16_224", {**VIT, "img_size": 64}, 32)
    assert given["img_size"] == 64  # what the config sets wins


def test_unknown_architectures_and_bad_kwargs_name_the_model():
    with pytest.raises(EncoderError, match="'not_a_net' is not a timm architecture"):
        backbone_kwargs("not_a_net", {}, 32)
    with pytest.raises(EncoderError, match="timm model 'resnet10t' rejects kwargs"):
        build_backbone("resnet10t", {"no_such_kwarg": 1})


def test_the_vit_token_path_reproduces_timms_forward():
    torch.manual_seed(0)
    model = build_backbone("vit_tiny_patch16_224", backbone_kwargs("vit_tiny_patch16_224", VIT, 32))
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    tokens = vit_patch_tokens(model, x)
    assert tokens.shape == (2, 16, 32)  # (32 / 8)^2 patches of width 32
    encoded = vit_encode_tokens(model, tokens)
    assert torch.allclose(encoded, model.forward_features(x), atol=1e-6)
    assert is_vit(model) and pooling(model) == "cls" and feature_dim(model) == 32


def test_a_resnet_is_mean_pooled_and_not_a_vit():
    model = timm.create_model("resnet10t", pretrained=False, num_classes=0)
    assert not is_vit(model) and pooling(model) == "mean" and feature_dim(model) == 512


def test_a_convnet_trains_channels_last_on_the_cpu_only():
    cnn = build_backbone("resnet10t", {"channels": [8, 16, 16, 32], "stem_width": 8})
    vit = build_backbone(
        "vit_tiny_patch16_224",
        {"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2, "img_size": 32},
    )
    assert memory_format(cnn, "cpu") == torch.channels_last
    assert memory_format(cnn, torch.device("cuda", 0)) == torch.contiguous_format
    assert memory_format(vit, "cpu") == torch.contiguous_format

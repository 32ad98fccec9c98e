"""The three encoders of the CIFAR-10 study, with one output width, and the SimCLR projection head.

Ordered by inductive bias, strongest first (seed 002):

- ``resnet18``: ResNet-18 (He et al. 2016; timm's ``ResNet`` with BasicBlocks [2, 2, 2, 2])
  adapted to 32 px as in SimCLR appendix B.9: the 7x7 stride-2 stem convolution becomes 3x3
  stride 1 and the stem max-pool is removed. ``width`` scales the stage widths (w, 2w, 4w, 8w;
  the stem stays 64 wide); w = 64 is the standard ResNet-18 (11.2 M parameters, 512 features).
- ``vit``: a small ViT (Dosovitskiy et al. 2021; timm ``VisionTransformer``) on 4x4 patches
  (64 tokens at 32 px) with a class token; its linear head maps the class token to the width.
- ``mlp``: an MLP on the flattened pixels, ``Linear -> BatchNorm -> ReLU`` per layer.

Every encoder outputs ``feature_dim`` values (a linear map is appended to the ResNet when
8 w != feature_dim): the representation the linear probe reads. The projection head
``Linear -> BN -> ReLU -> Linear`` (SimCLR's g) is used by the loss only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from repdiag.core.errors import ConfigError
from repdiag.core.registry import Registry
from repdiag.encoders.zoo.heads import MLPHead

ARCHITECTURES: Registry = Registry("CIFAR encoder architecture")
TRAINING_ONLY_KEYS = (
    "lr",
)  # per-architecture training settings that are not constructor arguments


@ARCHITECTURES.register("resnet18")
def resnet18_32px(feature_dim: int, image_size: int, width: int) -> nn.Module:
    """ResNet-18 with a 3x3 stride-1 stem and no stem max-pool (SimCLR's CIFAR variant)."""
    from timm.models.resnet import BasicBlock, ResNet

    channels = (width, 2 * width, 4 * width, 8 * width)
    net = ResNet(BasicBlock, [2, 2, 2, 2], num_classes=0, channels=channels)
    stem = net.bn1.num_features  # timm's single-conv stem is 64 wide whatever the stage widths
    net.conv1 = nn.Conv2d(3, stem, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    if net.num_features == feature_dim:
        return net
    return nn.Sequential(net, nn.Linear(net.num_features, feature_dim))


@ARCHITECTURES.register("vit")
def vit_small_patches(
    feature_dim: int,
    image_size: int,
    patch_size: int,
    embed_dim: int,
    depth: int,
    num_heads: int,
    mlp_ratio: float,
) -> nn.Module:
    """ViT on ``patch_size`` patches; the class token through a linear map to ``feature_dim``."""
    from timm.models.vision_transformer import VisionTransformer

    if image_size % patch_size:
        raise ConfigError(
            f"cifar.encoders.vit.patch_size = {patch_size} must divide the image size {image_size}"
        )
    if embed_dim % num_heads:
        raise ConfigError(
            f"cifar.encoders.vit.embed_dim = {embed_dim} must be a multiple of num_heads = {num_heads}"
        )
    return VisionTransformer(
        img_size=image_size,
        patch_size=patch_size,
        num_classes=feature_dim,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        mlp_ratio=mlp_ratio,
        global_pool="token",
    )


@ARCHITECTURES.register("mlp")
def pixel_mlp(feature_dim: int, image_size: int, hidden: Sequence[int]) -> nn.Module:
    """Flatten (3, S, S) -> [Linear -> BN -> ReLU] for each hidden width and for the output."""
    widths = [3 * image_size * image_size, *hidden, feature_dim]
    layers: list[nn.Module] = [nn.Flatten()]
    for d_in, d_out in itertools.pairwise(widths):
        layers += [nn.Linear(d_in, d_out), nn.BatchNorm1d(d_out), nn.ReLU()]
    return nn.Sequential(*layers)


def build_cifar_encoder(
    architecture: str, settings: Mapping[str, Any], feature_dim: int, image_size: int
) -> nn.Module:
    """The registered encoder ``architecture`` built from its ``cifar.encoders.<name>`` settings."""
    kwargs = {k: v for k, v in settings.items() if k not in TRAINING_ONLY_KEYS}
    try:
        return ARCHITECTURES.get(architecture)(feature_dim, image_size, **kwargs)
    except TypeError as err:
        raise ConfigError(f"cifar.encoders.{architecture}: {err}") from err


class SimCLRModel(nn.Module):
    """Encoder f (representation h, read by the probe) and projection head g (z = g(h), the loss)."""

    def __init__(self, encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(x)
        return h, self.head(h)


def build_simclr_model(
    architecture: str,
    settings: Mapping[str, Any],
    feature_dim: int,
    head_hidden: int,
    head_out: int,
    image_size: int,
) -> SimCLRModel:
    """Encoder plus the head ``feature_dim -> head_hidden -> BN -> ReLU -> head_out``."""
    encoder = build_cifar_encoder(architecture, settings, feature_dim, image_size)
    head = MLPHead([feature_dim, head_hidden, head_out], norm="batch", activation="relu")
    return SimCLRModel(encoder, head)


def parameter_count(module: nn.Module) -> int:
    return int(sum(p.numel() for p in module.parameters()))


def output_width(encoder: nn.Module, image_size: int) -> int:
    """Width of the encoder's output, measured on a zero batch of two (eval mode, no grad)."""
    was_training = encoder.training
    encoder.eval()
    with torch.no_grad():
        width = encoder(torch.zeros(2, 3, image_size, image_size)).shape[1:]
    encoder.train(was_training)
    return int(math.prod(width))

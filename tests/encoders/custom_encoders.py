"""Encoders for ``source: python`` entries in the tests (``tests.encoders.custom_encoders:<name>``)."""

from __future__ import annotations

from typing import ClassVar

import timm
import torch
from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(h)


class TokenNet(nn.Module):
    """Patchify -> class token + positions -> residual ``blocks`` -> LayerNorm -> class token.

    A transformer-shaped module that timm/torchvision do not know: the generic taps find its
    ``blocks`` and ``num_prefix_tokens``, and ``forward`` returns the normed class token.
    """

    preprocess_cfg: ClassVar[dict[str, object]] = {
        "input_size": 16,
        "mean": [0.5, 0.5, 0.5],
        "std": [0.25, 0.25, 0.25],
        "interpolation": "bilinear",
    }
    num_prefix_tokens = 1

    def __init__(self, width: int = 12, depth: int = 3, patch: int = 4, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng():  # same seed, same weights; the caller's RNG is untouched
            torch.manual_seed(seed)
            self.patch = nn.Conv2d(3, width, kernel_size=patch, stride=patch)
            self.cls_token = nn.Parameter(torch.randn(1, 1, width))
            self.pos = nn.Parameter(0.1 * torch.randn(1, 1 + (16 // patch) ** 2, width))
            self.blocks = nn.ModuleList(ResidualBlock(width) for _ in range(depth))
            self.norm = nn.LayerNorm(width)

    def tokens(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The token sequence after each block: the reference the taps are compared with."""
        h = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls_token.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        outputs = []
        for block in self.blocks:
            h = block(h)
            outputs.append(h)
        return outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tokens(x)[-1])[:, 0]


def token_net(width: int = 12, depth: int = 3, seed: int = 0) -> nn.Module:
    return TokenNet(width=width, depth=depth, seed=seed)


def conv_net(width: int = 6) -> nn.Module:
    """No blocks and no known architecture: its (pooled) output is the only tap, ``final``."""
    with torch.random.fork_rng():
        torch.manual_seed(1)
        return nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, stride=2)
        )


def small_vit(**kwargs) -> nn.Module:
    """A timm model returned by user code: it gets timm's taps and preprocessing."""
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, **kwargs
    )


class NaNNet(nn.Module):
    """Mean colour per image, NaN for every image whose top-left pixel is darker than the mean."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = x.mean(dim=(2, 3))
        return torch.where(x[:, :1, 0, 0] < 0, torch.full_like(pooled, float("nan")), pooled)


def nan_net() -> nn.Module:
    return NaNNet()


def not_a_module() -> int:
    return 42

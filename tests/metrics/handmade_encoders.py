"""Hand-built encoders with known binding behaviour, loaded as ``python:`` registry entries.

Each callable returns an ``nn.Module`` mapping preprocessed images (N, 3, S, S) to (N, D):

- :func:`foreground_mask`: a downsampled binary foreground mask; keeps the layout (which slot
  holds which silhouette) and ignores colour, so it should bind well.
- :func:`bag_of_features`: per-pixel colour and fixed random local filters, globally averaged; it
  knows which shapes and colours are present but not where, so it should stay near chance.
- :func:`random_features`: Gaussian noise independent of the image: chance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ForegroundMask(nn.Module):
    """Mask of pixels whose colour differs from the corner (background) pixel, average-pooled."""

    def __init__(self, grid: int = 16, threshold: float = 0.3) -> None:
        super().__init__()
        self.grid, self.threshold = grid, threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        background = x[:, :, :1, :1]
        mask = ((x - background).abs().amax(dim=1, keepdim=True) > self.threshold).to(x.dtype)
        return F.adaptive_avg_pool2d(mask, self.grid).flatten(1)


class BagOfFeatures(nn.Module):
    """Global average of per-pixel [colour, relu(random 5x5 filters)]: what, never where."""

    def __init__(self, n_filters: int = 32, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.register_buffer("filters", torch.randn(n_filters, 3, 5, 5, generator=generator) / 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.relu(F.conv2d(F.pad(x, (2, 2, 2, 2), mode="replicate"), self.filters))
        return torch.cat([x, local], dim=1).mean(dim=(2, 3))


class RandomFeatures(nn.Module):
    """Fresh Gaussian noise for every image, from a seeded generator: no information at all."""

    def __init__(self, dim: int = 64, seed: int = 0) -> None:
        super().__init__()
        self.dim = dim
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(x.shape[0], self.dim, generator=self.generator)
        return noise.to(x.device, x.dtype) + 0.0 * x.mean()  # keeps the output on x's graph


def foreground_mask() -> nn.Module:
    return ForegroundMask()


def bag_of_features() -> nn.Module:
    return BagOfFeatures()


def random_features() -> nn.Module:
    return RandomFeatures()

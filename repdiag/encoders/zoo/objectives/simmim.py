"""SimMIM (Xie et al. 2022, "SimMIM: a Simple Framework for Masked Image Modeling"): masked image
modelling for any backbone with a feature map, a ConvNet included. Square patches of the input are
replaced by a learned mask colour, the backbone encodes the whole image, and a one-layer head (a
1x1 convolution to ``stride^2 * 3`` values per feature-map cell, then a pixel shuffle back to the
input size) regresses the pixels; the loss is the L1 error on the masked pixels only (sec. 3)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from repdiag.core.errors import ConfigError
from repdiag.encoders.zoo.augment import mae_view
from repdiag.encoders.zoo.objectives.base import Batch, Objective, register
from repdiag.encoders.zoo.scenes import SceneSettings


def simmim_loss(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``L = sum_{c,y,x} m_yx |pred - target| / (3 sum_{y,x} m_yx)``: mean absolute error over the
    masked pixels (``mask`` (B, 1, H, W) in {0, 1}) and channels."""
    return ((pred - target).abs() * mask).sum() / (mask.sum() * pred.shape[1]).clamp(min=1.0)


def patch_mask(
    batch_size: int, image_size: int, patch: int, ratio: float, gen: torch.Generator
) -> torch.Tensor:
    """(B, 1, H, W) float: 1 on ``round(ratio * n)`` random patches of ``patch`` px of each image."""
    grid = image_size // patch
    n = grid * grid
    n_masked = max(1, round(ratio * n))
    order = torch.argsort(torch.rand(batch_size, n, generator=gen), dim=1)
    masked = torch.zeros(batch_size, n).scatter(1, order[:, :n_masked], 1.0)
    cells = masked.view(batch_size, 1, grid, grid)
    return cells.repeat_interleave(patch, dim=2).repeat_interleave(patch, dim=3)


@register
class SimMIM(Objective):
    """Backbone feature map -> 1x1 conv -> pixel shuffle; learned mask colour at the input."""

    name = "simmim"
    family = "masked_modeling"

    def __init__(
        self,
        backbone: nn.Module,
        scenes: SceneSettings,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
        *,
        mask_ratio: float,
        mask_patch: int,
    ) -> None:
        super().__init__(backbone, scenes, mean, std)
        if self.image_size % mask_patch:
            raise ConfigError(
                f"zoo.hparams.simmim.mask_patch ({mask_patch}) must divide zoo.image_size "
                f"({self.image_size})"
            )
        training = backbone.training
        backbone.eval()  # a probe of the output shape; eval BatchNorm leaves every buffer as is
        with torch.no_grad():
            features = backbone.forward_features(
                torch.zeros(1, 3, self.image_size, self.image_size)
            )
        backbone.train(training)
        if features.ndim != 4:
            raise ConfigError(
                "the simmim objective needs a backbone whose forward_features is a (B, C, h, w) "
                "feature map (a ConvNet); use mae for a ViT"
            )
        channels, height = int(features.shape[1]), int(features.shape[2])
        if self.image_size % height:
            raise ConfigError(f"simmim: feature map of side {height} does not tile the input")
        self.stride = self.image_size // height
        self.mask_ratio, self.mask_patch = float(mask_ratio), int(mask_patch)
        self.mask_token = nn.Parameter(torch.zeros(1, 3, 1, 1))
        self.decoder = nn.Sequential(
            nn.Conv2d(channels, self.stride * self.stride * 3, kernel_size=1),
            nn.PixelShuffle(self.stride),
        )
        self.view = mae_view(self.image_size)

    def loss(self, batch: Batch, gen: torch.Generator) -> torch.Tensor:
        x = self.normalize(self.view(batch.images, gen))
        mask = patch_mask(x.shape[0], self.image_size, self.mask_patch, self.mask_ratio, gen)
        mask = mask.to(x.device)
        corrupted = x * (1 - mask) + self.mask_token * mask
        pred = self.decoder(self.backbone.forward_features(corrupted))
        return simmim_loss(pred, x, mask)

    def trivial_loss(self, batch: Batch) -> float:
        """Predicting every pixel as its channel's median (the best constant under L1)."""
        x = self.normalize(batch.images)
        median = x.transpose(0, 1).flatten(1).median(dim=1).values.view(1, 3, 1, 1)
        return float((x - median).abs().mean())

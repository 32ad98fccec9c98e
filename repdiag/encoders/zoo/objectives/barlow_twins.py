"""Barlow Twins (Zbontar et al. 2021, "Barlow Twins: Self-Supervised Learning via Redundancy
Reduction", eqs. 1-2): make the cross-correlation of two views' embeddings the identity."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from repdiag.encoders.zoo.augment import byol_views
from repdiag.encoders.zoo.backbones import feature_dim
from repdiag.encoders.zoo.heads import MLPHead
from repdiag.encoders.zoo.objectives.base import Batch, Objective, register
from repdiag.encoders.zoo.scenes import SceneSettings

BN_EPS = 1e-5  # the reference code standardises with BatchNorm1d(affine=False)


def standardize(z: torch.Tensor, eps: float = BN_EPS) -> torch.Tensor:
    """Per-dimension ``(z - mean_b z) / sqrt(var_b z + eps)`` with the biased batch variance."""
    return (z - z.mean(dim=0)) / torch.sqrt(z.var(dim=0, unbiased=False) + eps)


def cross_correlation(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """``C_ij = sum_b zhat1_bi zhat2_bj / N`` of the standardised embeddings (N = batch)."""
    return standardize(z1).T @ standardize(z2) / z1.shape[0]


def barlow_twins_loss(z1: torch.Tensor, z2: torch.Tensor, lambda_offdiag: float) -> torch.Tensor:
    """``L = sum_i (1 - C_ii)^2 + lambda sum_i sum_{j != i} C_ij^2``.

    ``z1``, ``z2``: (N, D) projector outputs of two views of the same N images.
    """
    c = cross_correlation(z1, z2)
    on_diag = (torch.diagonal(c) - 1).pow(2).sum()
    off_diag = c.pow(2).sum() - torch.diagonal(c).pow(2).sum()
    return on_diag + lambda_offdiag * off_diag


@register
class BarlowTwins(Objective):
    """Two BYOL-style views, backbone + BN-ReLU projector, redundancy-reduction loss."""

    name = "barlow_twins"
    family = "variance_decorrelation"

    def __init__(
        self,
        backbone: nn.Module,
        scenes: SceneSettings,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
        *,
        projector_dims: Sequence[int],
        lambda_offdiag: float,
    ) -> None:
        super().__init__(backbone, scenes, mean, std)
        self.lambda_offdiag = lambda_offdiag
        self.projector = MLPHead(
            [feature_dim(backbone), *projector_dims], norm="batch", activation="relu"
        )
        self.views = byol_views(self.image_size)

    def loss(self, batch: Batch, gen: torch.Generator) -> torch.Tensor:
        x1, x2 = (self.normalize(view(batch.images, gen)) for view in self.views)
        z = self.projector(self.backbone(torch.cat([x1, x2])))
        z1, z2 = z.chunk(2)
        return barlow_twins_loss(z1, z2, self.lambda_offdiag)

    def trivial_loss(self, batch: Batch) -> float:
        """Views whose projections are uncorrelated (C = 0): every diagonal term costs 1, so D."""
        return float(self.projector.description["dims"][-1])

    def export(self) -> tuple[nn.Module, MLPHead]:
        return self.backbone, self.projector

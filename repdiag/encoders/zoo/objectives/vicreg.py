"""VICReg (Bardes, Ponce and LeCun 2022, "VICReg: Variance-Invariance-Covariance Regularization
for Self-Supervised Learning", eqs. 1-6): invariance plus variance and covariance regularisers."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from repdiag.encoders.zoo.augment import byol_views
from repdiag.encoders.zoo.backbones import feature_dim
from repdiag.encoders.zoo.heads import MLPHead
from repdiag.encoders.zoo.objectives.base import Batch, Objective, register
from repdiag.encoders.zoo.scenes import SceneSettings


def variance_term(z: torch.Tensor, gamma: float, eps: float = 1e-4) -> torch.Tensor:
    """``v(Z) = mean_j max(0, gamma - sqrt(Var(z_j) + eps))`` (unbiased variance, eq. 1)."""
    std = torch.sqrt(z.var(dim=0) + eps)
    return F.relu(gamma - std).mean()


def covariance_term(z: torch.Tensor) -> torch.Tensor:
    """``c(Z) = sum_{i != j} C(Z)_ij^2 / D`` with ``C`` the unbiased covariance (eqs. 3-4)."""
    n, d = z.shape
    centred = z - z.mean(dim=0)
    cov = centred.T @ centred / (n - 1)
    return (cov.pow(2).sum() - torch.diagonal(cov).pow(2).sum()) / d


def vicreg_loss(
    z1: torch.Tensor,
    z2: torch.Tensor,
    sim_coeff: float,
    std_coeff: float,
    cov_coeff: float,
    gamma: float,
) -> torch.Tensor:
    """``L = lambda s(Z, Z') + mu [v(Z) + v(Z')] / 2 + nu [c(Z) + c(Z')]``.

    ``s`` is the mean squared error between the views. The variance pair is averaged, as in the
    authors' code (facebookresearch/vicreg) and lightly's ``VICRegLoss``.
    """
    invariance = F.mse_loss(z1, z2)
    variance = (variance_term(z1, gamma) + variance_term(z2, gamma)) / 2
    covariance = covariance_term(z1) + covariance_term(z2)
    return sim_coeff * invariance + std_coeff * variance + cov_coeff * covariance


@register
class VICReg(Objective):
    """Two BYOL-style views, backbone + BN-ReLU expander, VICReg loss."""

    name = "vicreg"
    family = "variance_decorrelation"

    def __init__(
        self,
        backbone: nn.Module,
        scenes: SceneSettings,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
        *,
        projector_dims: Sequence[int],
        sim_coeff: float,
        std_coeff: float,
        cov_coeff: float,
        gamma: float,
    ) -> None:
        super().__init__(backbone, scenes, mean, std)
        self.coeffs = {
            "sim_coeff": sim_coeff,
            "std_coeff": std_coeff,
            "cov_coeff": cov_coeff,
            "gamma": gamma,
        }
        self.projector = MLPHead(
            [feature_dim(backbone), *projector_dims], norm="batch", activation="relu"
        )
        self.views = byol_views(self.image_size)

    def loss(self, batch: Batch, gen: torch.Generator) -> torch.Tensor:
        x1, x2 = (self.normalize(view(batch.images, gen)) for view in self.views)
        z1, z2 = self.projector(self.backbone(torch.cat([x1, x2]))).chunk(2)
        return vicreg_loss(z1, z2, **self.coeffs)

    def trivial_loss(self, batch: Batch) -> float:
        """Collapse to one point: no invariance or covariance cost, the variance hinge at
        mu max(0, gamma - sqrt(eps))."""
        return self.coeffs["std_coeff"] * max(0.0, self.coeffs["gamma"] - math.sqrt(1e-4))

    def export(self) -> tuple[nn.Module, MLPHead]:
        return self.backbone, self.projector

"""SimCLR (Chen et al. 2020, "A Simple Framework for Contrastive Learning of Visual
Representations", eq. 1): the NT-Xent loss over two augmented views."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from repdiag.encoders.zoo.augment import simclr_view
from repdiag.encoders.zoo.backbones import feature_dim
from repdiag.encoders.zoo.heads import MLPHead
from repdiag.encoders.zoo.objectives.base import Batch, Objective, register
from repdiag.encoders.zoo.scenes import SceneSettings


def nt_xent_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """``l(i, j) = -log exp(s_ij / tau) / sum_{k != i} exp(s_ik / tau)``, averaged over all 2N
    anchors, with ``s`` the cosine similarity and ``j`` the other view of anchor ``i``."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n = z1.shape[0]
    logits = z @ z.T / temperature
    logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
    positives = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(logits, positives)


@register
class SimCLR(Objective):
    """Two SimCLR views, backbone + projection head, NT-Xent."""

    name = "simclr"
    family = "contrastive"

    def __init__(
        self,
        backbone: nn.Module,
        scenes: SceneSettings,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
        *,
        projector_dims: Sequence[int],
        temperature: float,
    ) -> None:
        super().__init__(backbone, scenes, mean, std)
        self.temperature = temperature
        self.projector = MLPHead(
            [feature_dim(backbone), *projector_dims], norm="batch", activation="relu"
        )
        self.view = simclr_view(self.image_size)

    def loss(self, batch: Batch, gen: torch.Generator) -> torch.Tensor:
        x1, x2 = (
            self.normalize(self.view(batch.images, gen)),
            self.normalize(self.view(batch.images, gen)),
        )
        z1, z2 = self.projector(self.backbone(torch.cat([x1, x2]))).chunk(2)
        return nt_xent_loss(z1, z2, self.temperature)

    def trivial_loss(self, batch: Batch) -> float:
        """Collapsed embeddings: all 2B - 1 similarities equal, so the loss is log(2B - 1)."""
        return math.log(2 * batch.images.shape[0] - 1)

    def export(self) -> tuple[nn.Module, MLPHead]:
        return self.backbone, self.projector

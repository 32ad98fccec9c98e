"""DINO (Caron et al. 2021, "Emerging Properties in Self-Supervised Vision Transformers",
eq. 1-2 and algorithm 1): self-distillation from an EMA teacher with centering and sharpening."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from repdiag.encoders.zoo.augment import dino_views
from repdiag.encoders.zoo.backbones import feature_dim
from repdiag.encoders.zoo.heads import MLPHead
from repdiag.encoders.zoo.objectives.base import Batch, Objective, register
from repdiag.encoders.zoo.scenes import SceneSettings


def dino_loss(
    student: list[torch.Tensor],
    teacher: list[torch.Tensor],
    center: torch.Tensor,
    student_temp: float,
    teacher_temp: float,
) -> torch.Tensor:
    """``L = mean over pairs (i, j), j != i, of mean_b H(P_t^i, P_s^j)``.

    ``P_t^i = softmax((g_t^i - c) / tau_t)`` for each teacher (global) crop ``i`` (centering, then
    sharpening with the low ``tau_t``), ``P_s^j = softmax(g_s^j / tau_s)`` for each student crop
    ``j``; ``H(a, b) = -sum_k a_k log b_k``. Student crop ``j`` pairs with teacher crop ``i`` unless
    they are the same global crop (``j == i``, the first ``len(teacher)`` student crops are the
    global ones).
    """
    targets = [F.softmax((t - center) / teacher_temp, dim=-1).detach() for t in teacher]
    log_probs = [F.log_softmax(s / student_temp, dim=-1) for s in student]
    total, terms = student[0].new_zeros(()), 0
    for i, target in enumerate(targets):
        for j, log_prob in enumerate(log_probs):
            if i == j:
                continue
            total = total + (-(target * log_prob).sum(dim=-1)).mean()
            terms += 1
    return total / terms


def update_center(
    center: torch.Tensor, teacher: list[torch.Tensor], momentum: float
) -> torch.Tensor:
    """``c <- m c + (1 - m) mean_b g_t`` over every teacher output of the batch."""
    return center * momentum + torch.cat(teacher).mean(dim=0, keepdim=True) * (1 - momentum)


def teacher_momentum(step: int, total_steps: int, base: float) -> float:
    """Cosine schedule from ``base`` at step 0 to 1 at the last step (DINO sec. 3.1)."""
    if total_steps <= 1:
        return base
    return 1 - (1 - base) * (math.cos(math.pi * step / (total_steps - 1)) + 1) / 2


class DINOHead(nn.Module):
    """MLP to a bottleneck, l2 normalisation, then a weight-normalised prototype layer (g = 1)."""

    def __init__(self, in_dim: int, hidden_dim: int, bottleneck_dim: int, out_dim: int) -> None:
        super().__init__()
        self.mlp = MLPHead([in_dim, hidden_dim, hidden_dim, bottleneck_dim], activation="gelu")
        self.prototypes = nn.Parameter(torch.empty(out_dim, bottleneck_dim))
        nn.init.trunc_normal_(self.prototypes, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.normalize(self.mlp(x), dim=-1)
        return x @ F.normalize(self.prototypes, dim=-1).T


@register
class DINO(Objective):
    """Student (trained) and teacher (EMA of the student, centred and sharpened) on multi-crops."""

    name = "dino"
    family = "clustering_distillation"
    backbone_extras: ClassVar[Mapping[str, Any]] = {
        "dynamic_img_size": True
    }  # local crops are smaller than global ones

    def __init__(
        self,
        backbone: nn.Module,
        scenes: SceneSettings,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
        *,
        out_dim: int,
        hidden_dim: int,
        bottleneck_dim: int,
        student_temp: float,
        teacher_temp: float,
        center_momentum: float,
        teacher_momentum: float,
        n_local_crops: int,
        freeze_prototypes_fraction: float,
    ) -> None:
        super().__init__(backbone, scenes, mean, std)
        self.head = DINOHead(feature_dim(backbone), hidden_dim, bottleneck_dim, out_dim)
        self.teacher_backbone = copy.deepcopy(backbone)
        self.teacher_head = copy.deepcopy(self.head)
        for p in [*self.teacher_backbone.parameters(), *self.teacher_head.parameters()]:
            p.requires_grad_(False)
        self.register_buffer("center", torch.zeros(1, out_dim))
        self.center_ready = False
        self.temps = (student_temp, teacher_temp)
        self.center_momentum = center_momentum
        self.base_momentum = teacher_momentum
        self.n_local_crops = n_local_crops
        self.freeze_prototypes_fraction = freeze_prototypes_fraction
        self.global_a, self.global_b, self.local = dino_views(self.image_size, self.image_size // 2)

    def loss(self, batch: Batch, gen: torch.Generator) -> torch.Tensor:
        images = batch.images
        globals_ = [
            self.normalize(self.global_a(images, gen)),
            self.normalize(self.global_b(images, gen)),
        ]
        locals_ = [self.normalize(self.local(images, gen)) for _ in range(self.n_local_crops)]
        both = torch.cat(globals_)
        with torch.no_grad():
            teacher = self.teacher_head(self.teacher_backbone(both)).chunk(2)
        student = list(self.head(self.backbone(both)).chunk(2))
        if locals_:
            student += list(self.head(self.backbone(torch.cat(locals_))).chunk(len(locals_)))
        with torch.no_grad():
            if not self.center_ready:  # start from the first batch's mean rather than 0
                self.center.copy_(torch.cat(teacher).mean(dim=0, keepdim=True))
                self.center_ready = True
        loss = dino_loss(student, list(teacher), self.center, *self.temps)
        with torch.no_grad():
            self.center.copy_(update_center(self.center, list(teacher), self.center_momentum))
        return loss

    def trivial_loss(self, batch: Batch) -> float:
        """Collapse to the uniform distribution over the K prototypes: cross-entropy log K."""
        return math.log(self.center.shape[1])

    def before_update(self, step: int, total_steps: int) -> None:
        """Keep the prototype layer fixed for the first steps (DINO's ``freeze_last_layer``): the
        student cannot then flatten its output by moving prototypes, the early collapse mode."""
        if step < self.freeze_prototypes_fraction * total_steps:
            self.head.prototypes.grad = None

    @torch.no_grad()
    def after_step(self, step: int, total_steps: int) -> None:
        """Teacher <- m teacher + (1 - m) student, ``m`` on the cosine schedule."""
        m = teacher_momentum(step, total_steps, self.base_momentum)
        teacher = [*self.teacher_backbone.parameters(), *self.teacher_head.parameters()]
        student = [*self.backbone.parameters(), *self.head.parameters()]
        torch._foreach_mul_(teacher, m)  # one fused pass over all weights, as the loop computed
        torch._foreach_add_(teacher, student, alpha=1 - m)
        buffers = [*self.teacher_backbone.buffers(), *self.teacher_head.buffers()]
        if buffers:  # BatchNorm statistics (a ViT has none)
            torch._foreach_copy_(buffers, [*self.backbone.buffers(), *self.head.buffers()])

    def export(self) -> tuple[nn.Module, MLPHead]:
        """The teacher (DINO evaluates the teacher) and its head MLP up to the bottleneck."""
        return self.teacher_backbone, self.teacher_head.mlp

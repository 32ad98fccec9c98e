"""Supervised: cross-entropy on scene labels (which shape sits in each slot, or which shapes are
present), the analogue of ImageNet classification (Deng et al. 2009; e.g. Dosovitskiy et al.
2021 for ViT). A presence run can also be told the slots at a dose: ``slot_weight`` (lambda)
weights a second head's slot cross-entropy, ``L = L_presence + lambda * L_slots``, the
manipulated factor of the binding dose series."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from repdiag.encoders.zoo.augment import label_safe_view
from repdiag.encoders.zoo.backbones import feature_dim
from repdiag.encoders.zoo.heads import MLPHead
from repdiag.encoders.zoo.objectives.base import Batch, Objective, register
from repdiag.encoders.zoo.scenes import SceneSettings


def supervised_loss(
    logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float
) -> torch.Tensor:
    """``L = -mean_{b,s} sum_c q_bsc log softmax(logits_bs)_c`` with ``q`` the (smoothed) one-hot
    of ``labels[b, s]``: one softmax per slot (or per shape)."""
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), label_smoothing=label_smoothing)


def mirror_slots(grid: tuple[int, int]) -> np.ndarray:
    """Permutation ``p`` with ``labels_of_mirrored[:, s] = labels[:, p[s]]`` for a left-right flip."""
    rows, cols = grid
    return np.array([r * cols + (cols - 1 - c) for r in range(rows) for c in range(cols)])


def prior_entropy(labels: torch.Tensor, n_classes: int) -> float:
    """``mean_g H(p_g)`` with ``p_g`` the frequencies of ``labels[:, g]`` (B, groups) over the
    batch: the cross-entropy of predicting those frequencies for every image."""
    counts = F.one_hot(labels, n_classes).sum(dim=0).double()  # (groups, classes)
    prior = counts / counts.sum(dim=1, keepdim=True)
    entropy = -(prior * prior.clamp(min=1e-300).log()).sum(dim=1)
    return float(entropy.mean())


def presence(slot_shape: torch.Tensor, n_shapes: int) -> torch.Tensor:
    """(B, n_shapes) long: 1 where the shape occurs in some slot, else 0."""
    one_hot = F.one_hot(slot_shape, n_shapes + 1)[:, :, 1:]
    return one_hot.amax(dim=1)


@register
class Supervised(Objective):
    """Backbone + linear classifier; flips mirror the slot labels, colour jitter keeps them."""

    name = "supervised"
    family = "supervised"

    def __init__(
        self,
        backbone: nn.Module,
        scenes: SceneSettings,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
        *,
        label: str,
        label_smoothing: float,
        slot_weight: float,
    ) -> None:
        super().__init__(backbone, scenes, mean, std)
        self.label = label
        self.label_smoothing = label_smoothing
        self.slot_weight = float(slot_weight)
        n_shapes = len(scenes.shapes)
        if label == "slot_shape":
            self.groups, self.classes = scenes.n_slots, n_shapes + 1
        elif label == "shape_presence":
            self.groups, self.classes = n_shapes, 2
        else:
            raise ValueError(f"zoo.hparams.supervised.label: unknown label {label!r}")
        if self.slot_weight and label != "shape_presence":
            raise ValueError(
                "zoo.hparams.supervised.slot_weight: a dose of slot labels needs "
                f"label: shape_presence (got {label!r})"
            )
        self.classifier = MLPHead([feature_dim(backbone), self.groups * self.classes])
        # built after the classifier, and only for lambda > 0: the backbone and the presence head
        # start from the same weights at every dose, and lambda = 0 is the presence run exactly
        self.slot_classifier = (
            MLPHead([feature_dim(backbone), scenes.n_slots * (n_shapes + 1)])
            if self.slot_weight
            else None
        )
        self.register_buffer(
            "mirror", torch.from_numpy(mirror_slots(scenes.grid)), persistent=False
        )
        self.view = label_safe_view(self.image_size)

    def slot_targets(self, slot_shape: torch.Tensor, flipped: torch.Tensor) -> torch.Tensor:
        """(B, n_slots) long: the shape (1 + index, 0 empty) in each slot of the flipped view."""
        flipped = flipped.to(slot_shape.device).view(-1, 1)
        return torch.where(flipped, slot_shape[:, self.mirror], slot_shape)

    def targets(self, slot_shape: torch.Tensor, flipped: torch.Tensor) -> torch.Tensor:
        if self.label == "shape_presence":
            return presence(slot_shape, len(self.scenes.shapes))
        return self.slot_targets(slot_shape, flipped)

    def loss_terms(self, batch: Batch, gen: torch.Generator) -> dict[str, torch.Tensor]:
        """The loss's terms by label: ``{label: L_label}`` and, at a dose, ``slot_shape``:
        L_slots (unweighted). :meth:`loss` is L_label + lambda * L_slots."""
        x, flipped = self.view.apply(batch.images, gen)
        features = self.backbone(self.normalize(x))
        logits = self.classifier(features).view(-1, self.groups, self.classes)
        terms = {
            self.label: supervised_loss(
                logits, self.targets(batch.slot_shape, flipped), self.label_smoothing
            )
        }
        if self.slot_classifier is not None:
            slot_logits = self.slot_classifier(features).view(
                -1, self.scenes.n_slots, len(self.scenes.shapes) + 1
            )
            terms["slot_shape"] = supervised_loss(
                slot_logits, self.slot_targets(batch.slot_shape, flipped), self.label_smoothing
            )
        return terms

    def loss(self, batch: Batch, gen: torch.Generator) -> torch.Tensor:
        terms = self.loss_terms(batch, gen)
        if self.slot_classifier is None:
            return terms[self.label]
        return terms[self.label] + self.slot_weight * terms["slot_shape"]

    def trivial_loss(self, batch: Batch) -> float:
        """Predicting the batch's label frequencies for every image: their mean entropy (plus
        lambda times that of the slot labels when the run is told the slots at a dose)."""
        unflipped = torch.zeros(batch.slot_shape.shape[0], dtype=torch.bool)
        trivial = prior_entropy(self.targets(batch.slot_shape, unflipped), self.classes)
        if self.slot_classifier is not None:
            slots = self.slot_targets(batch.slot_shape, unflipped)
            trivial += self.slot_weight * prior_entropy(slots, len(self.scenes.shapes) + 1)
        return trivial

    def export(self) -> tuple[nn.Module, MLPHead]:
        return self.backbone, self.classifier

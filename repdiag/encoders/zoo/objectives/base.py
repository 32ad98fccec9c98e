"""What every zoo objective provides, and the registry that names them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from repdiag.core.registry import Registry
from repdiag.encoders.zoo.heads import MLPHead
from repdiag.encoders.zoo.scenes import SceneSettings

OBJECTIVES: Registry[type[Objective]] = Registry("zoo objective")


@dataclass
class Batch:
    """One training batch on the device: images float (B, 3, H, W) in [0, 1] plus annotations."""

    images: torch.Tensor
    captions: list[str]
    slot_shape: torch.Tensor  # (B, n_slots) long, 0 = empty slot
    slot_colour: torch.Tensor  # (B, n_slots) long, 0 = empty slot
    # the two label arrays on the host as well (numpy), when the batch came from one: what the
    # step reads in Python (caption words) without waiting for the device
    host_labels: tuple[np.ndarray, np.ndarray] | None = None


class Objective(nn.Module):
    """A backbone plus whatever its loss needs (heads, decoder, teacher, text tower).

    Subclasses set ``name`` and ``family``, take their hyperparameters as keyword arguments
    (exactly the keys of ``zoo.hparams.<name>``) and implement :meth:`loss`.
    """

    name: ClassVar[str]
    family: ClassVar[str]
    backbone_extras: ClassVar[Mapping[str, Any]] = {}  # kwargs the backbone takes when it can

    def __init__(
        self,
        backbone: nn.Module,
        scenes: SceneSettings,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.scenes = scenes
        self.image_size = scenes.image_size
        self.mean, self.std = [float(v) for v in mean], [float(v) for v in std]
        self.register_buffer(
            "pixel_mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1), persistent=False
        )
        self.register_buffer(
            "pixel_std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1), persistent=False
        )

    input_format: torch.memory_format = torch.contiguous_format  # the backbone's input layout

    def use_memory_format(self, memory_format: torch.memory_format) -> Objective:
        """Hold every 4-D weight in ``memory_format`` and hand the backbone its inputs in it
        (:meth:`normalize`); ``torch.channels_last`` is oneDNN's native layout on the CPU."""
        self.input_format = memory_format
        return self.to(memory_format=memory_format)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``(x - mean) / std`` per channel on images in [0, 1] (meta.json's ``preprocess``),
        laid out in :attr:`input_format`."""
        return ((x - self.pixel_mean) / self.pixel_std).contiguous(memory_format=self.input_format)

    def loss(self, batch: Batch, gen: torch.Generator) -> torch.Tensor:
        """Scalar loss of one batch; ``gen`` (CPU) drives every random choice."""
        raise NotImplementedError

    def trivial_loss(self, batch: Batch) -> float:
        """The loss of the objective's trivial solution (a constant or collapsed encoder, chance
        predictions) on ``batch``: a run that has not gone clearly below it has not learned."""
        raise NotImplementedError

    def before_update(self, step: int, total_steps: int) -> None:
        """Called after ``backward`` and before the optimiser step (e.g. to drop some gradients)."""

    def after_step(self, step: int, total_steps: int) -> None:
        """Called after each optimiser step (teacher EMA and the like)."""

    def export(self) -> tuple[nn.Module, MLPHead | None]:
        """The trained encoder to save: the backbone and its projection head (or ``None``)."""
        return self.backbone, None

    def trainable_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.named_parameters() if p.requires_grad]


def register(cls: type[Objective]) -> type[Objective]:
    """Class decorator: add ``cls`` to :data:`OBJECTIVES` under ``cls.name``."""
    OBJECTIVES.add(cls.name, cls)
    return cls

"""SimCLR views: the augmentation groups of the regimes, two random views per image.

SimCLR (Chen et al. 2020, appendix A and B.9 for CIFAR-10) makes two views of each image with
random resized crop + horizontal flip, colour jitter (strength s: brightness, contrast and
saturation 0.8 s, hue 0.2 s, applied with probability 0.8), random grayscale (0.2) and Gaussian
blur. "Loss is not enough" (seed 002) compares three regimes that restrict the support of the
positive-pair distribution:

- ``all``: every augmentation (widest support);
- ``crop_only``: the geometric ones only (random resized crop and flip): colours never change;
- ``no_crop``: the photometric ones only ("All w/o crop": jitter, grayscale, blur): pixels never
  move.

The regimes themselves live in :data:`repdiag.cifar.regimes.REGIMES` (torch-free, so the
workflow can list them); this module builds their augmentation groups. Transforms are
``torchvision.transforms.v2`` on float tensors (3, H, W) in [0, 1], one image at a time, so that
every image and every view draws its own random parameters from torch's global RNG (seeded per
DataLoader worker from the run's seed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.transforms import v2

from repdiag.cifar.regimes import REGIMES


def _geometric(settings: Mapping[str, Any], size: int) -> list[v2.Transform]:
    return [
        v2.RandomResizedCrop(
            size,
            scale=tuple(settings["crop_scale"]),
            ratio=tuple(settings["crop_ratio"]),
            antialias=True,
        ),
        v2.RandomHorizontalFlip(settings["flip_p"]),
    ]


def _photometric(settings: Mapping[str, Any], size: int) -> list[v2.Transform]:
    s = settings["jitter_strength"]
    return [
        v2.RandomApply(
            [v2.ColorJitter(0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s)], p=settings["jitter_p"]
        ),
        v2.RandomGrayscale(settings["grayscale_p"]),
        v2.RandomApply(
            [v2.GaussianBlur(settings["blur_kernel"], sigma=tuple(settings["blur_sigma"]))],
            p=settings["blur_p"],
        ),
    ]


GROUP_BUILDERS: dict[str, Callable[[Mapping[str, Any], int], list[v2.Transform]]] = {
    "geometric": _geometric,
    "photometric": _photometric,
}


def augmentation(regime: str, settings: Mapping[str, Any], image_size: int) -> v2.Compose:
    """The regime's random transform of one float image (3, H, W) in [0, 1] (no normalisation)."""
    groups = REGIMES.get(regime).groups
    return v2.Compose([t for group in groups for t in GROUP_BUILDERS[group](settings, image_size)])


def view_transform(
    regime: str,
    settings: Mapping[str, Any],
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
) -> v2.Compose:
    """uint8 (3, H, W) -> one normalised float32 view: scale to [0, 1], augment, normalise."""
    return v2.Compose(
        [
            v2.ToDtype(torch.float32, scale=True),
            augmentation(regime, settings, image_size),
            v2.Normalize(list(mean), list(std)),
        ]
    )


def eval_transform(mean: Sequence[float], std: Sequence[float]) -> v2.Compose:
    """uint8 (..., 3, H, W) -> normalised float32, no augmentation (features for the probe)."""
    return v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))])


def to_chw_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W, 3) numpy -> uint8 (N, 3, H, W) tensor (contiguous)."""
    return torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))


class TwoViews(Dataset):
    """Item i: two independent random views of image i (the SimCLR positive pair)."""

    def __init__(self, images: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor]):
        self.images, self.transform = images, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        return self.transform(image), self.transform(image)

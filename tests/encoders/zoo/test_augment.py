"""Batched augmentations: identities, closed forms, ranges and determinism, and each batched
operation against a per-sample reference computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from repdiag.encoders.zoo.augment import (
    Augment,
    Crop,
    adjust_hue,
    colour_jitter,
    gaussian_blur,
    grayscale,
    luminance,
    on_selected,
    resized_crop,
    solarize,
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
    same = resized_crop(X, 16, Crop(ones, zeros, half, torch.zeros(n, dtype=torch.bool)))
    assert torch.allclose(same, X, atol=1e-6)
    mirrored = resized_crop(X, 16, Crop(ones, zeros, half, torch.ones(n, dtype=torch.bool)))
    assert torch.allclose(mirrored, X.flip(-1), atol=1e-6)


def test_quarter_crop_of_the_top_left_corner():
    n = X.shape[0]
    # area 1/4, square: the top-left 8 x 8 block, resampled 1:1 at 8 px
    crop = resized_crop(X, 8, Crop(
        torch.full((n,), 0.25, dtype=torch.float64), torch.zeros(n, dtype=torch.float64),
        torch.zeros(n, 2, dtype=torch.float64), torch.zeros(n, dtype=torch.bool),
    ))  # fmt: skip
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


# --- the batched operations against per-sample references ---------------------------------------

N = 6
IMAGES = torch.rand(N, 3, 12, 10, generator=torch.Generator().manual_seed(1))
SELECTED = torch.tensor([True, False, True, True, False, True])
LUMA_REF = (0.299, 0.587, 0.114)


def reference_jitter(image, b: float, c: float, s: float, turns: float):
    """One (3, H, W) image in float64, torchvision's order, each step clamped to [0, 1]."""
    luma = torch.tensor(LUMA_REF, dtype=torch.float64).view(3, 1, 1)
    y = (image.double() * b).clamp(0, 1)
    mean = (y * luma).sum(0).mean()
    y = (mean + c * (y - mean)).clamp(0, 1)
    grey = (y * luma).sum(0, keepdim=True)
    y = (grey + s * (y - grey)).clamp(0, 1)
    r, g, bl = y
    yy = 0.299 * r + 0.587 * g + 0.114 * bl
    i = 0.596 * r - 0.274 * g - 0.322 * bl
    q = 0.211 * r - 0.523 * g + 0.312 * bl
    angle = 2 * math.pi * turns
    i, q = math.cos(angle) * i - math.sin(angle) * q, math.sin(angle) * i + math.cos(angle) * q
    yiq = torch.stack([yy, i, q]).reshape(3, -1)
    to_yiq = torch.tensor(
        [[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]],
        dtype=torch.float64,
    )
    return torch.linalg.solve(to_yiq, yiq).reshape(y.shape).clamp(0, 1)


def test_colour_jitter_matches_the_per_sample_reference_and_passes_the_rest_through():
    gen = torch.Generator().manual_seed(2)
    b, c, s = (0.6 + 0.8 * torch.rand(N, generator=gen, dtype=torch.float64) for _ in range(3))
    turns = 0.2 * torch.rand(N, generator=gen, dtype=torch.float64) - 0.1
    got = colour_jitter(IMAGES, b, c, s, turns, SELECTED)
    for k in range(N):
        if SELECTED[k]:
            expected = reference_jitter(IMAGES[k], *(float(v[k]) for v in (b, c, s, turns)))
            assert torch.allclose(got[k].double(), expected, atol=2e-6), k
        else:
            assert torch.equal(got[k], IMAGES[k]), k
    no_hue = colour_jitter(IMAGES, b, c, s, None, SELECTED)
    zero = torch.zeros(N, dtype=torch.float64)
    assert torch.allclose(no_hue, colour_jitter(IMAGES, b, c, s, zero, SELECTED), atol=1e-6)


def test_grayscale_selects_samples_and_keeps_the_others_bit_for_bit():
    got = grayscale(IMAGES, SELECTED)
    for k in range(N):
        if SELECTED[k]:
            assert torch.allclose(
                got[k], luminance(IMAGES[k : k + 1])[0].expand(3, -1, -1), atol=1e-6
            )
        else:
            assert torch.equal(got[k], IMAGES[k])


def reference_crop(image, size: int, scale: float, log_ratio: float, centre, flip: bool):
    """Bilinear resampling with reflection padding of one (3, H, W) image, by its definition:
    pixel (i, j) reads the source point ((u + 1) W - 1) / 2 of the crop's normalised grid,
    reflected about the borders -0.5 and W - 0.5, then clipped, weighted by distance."""
    _, h, w = image.shape
    ratio = math.exp(log_ratio)
    width, height = min(1.0, math.sqrt(scale * ratio)), min(1.0, math.sqrt(scale / ratio))
    cx, cy = (2 * centre[0] - 1) * (1 - width), (2 * centre[1] - 1) * (1 - height)
    out = torch.empty(3, size, size, dtype=torch.float64)

    def source(u: float, n: int) -> tuple[int, int, float]:
        p = ((u + 1) * n - 1) / 2
        d = abs(p + 0.5) % (2 * n)
        p = min(max((2 * n - d if d > n else d) - 0.5, 0.0), n - 1)
        lo = math.floor(p)
        return lo, min(lo + 1, n - 1), p - lo

    for i in range(size):
        y0, y1, fy = source(cy + height * ((2 * i + 1) / size - 1), h)
        for j in range(size):
            u = (2 * j + 1) / size - 1
            x0, x1, fx = source(cx + width * (-u if flip else u), w)
            top = (1 - fx) * image[:, y0, x0].double() + fx * image[:, y0, x1].double()
            bottom = (1 - fx) * image[:, y1, x0].double() + fx * image[:, y1, x1].double()
            out[:, i, j] = (1 - fy) * top + fy * bottom
    return out


def test_resized_crop_matches_the_per_sample_bilinear_reference():
    gen = torch.Generator().manual_seed(4)
    scale = 0.1 + 0.9 * torch.rand(N, generator=gen, dtype=torch.float64)
    log_ratio = 0.6 * torch.rand(N, generator=gen, dtype=torch.float64) - 0.3
    centre = torch.rand(N, 2, generator=gen, dtype=torch.float64)
    for size in (8, 15):
        got = resized_crop(IMAGES, size, Crop(scale, log_ratio, centre, SELECTED))
        for k in range(N):
            expected = reference_crop(
                IMAGES[k], size, float(scale[k]), float(log_ratio[k]), centre[k].tolist(),
                bool(SELECTED[k]),
            )  # fmt: skip
            assert torch.allclose(got[k].double(), expected, atol=2e-5), (size, k)


def test_the_full_frame_shortcut_is_the_crop_it_replaces():
    view = Augment(16, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), jitter=0.0, grayscale=0.0)
    assert view.full_frame(X) and not view.full_frame(X[..., :8, :8])
    got, flipped = view.apply(X, torch.Generator().manual_seed(5))
    assert torch.equal(got, torch.where(flipped.view(-1, 1, 1, 1), X.flip(-1), X))
    n = X.shape[0]
    ones, zeros = torch.ones(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    resampled = resized_crop(
        X, 16, Crop(ones, zeros, torch.rand(n, 2, dtype=torch.float64), flipped)
    )
    assert torch.allclose(got, resampled, atol=1e-6)


def test_blur_and_solarize_touch_the_selected_samples_only():
    sigma = torch.linspace(0.2, 1.0, N)
    blurred = on_selected(IMAGES, SELECTED, lambda y, s: gaussian_blur(y, s, 3), sigma)
    for k in range(N):
        alone = gaussian_blur(IMAGES[k : k + 1], sigma[k : k + 1], 3)[0]
        assert torch.allclose(blurred[k], alone if SELECTED[k] else IMAGES[k], atol=1e-6)
        if not SELECTED[k]:
            assert torch.equal(blurred[k], IMAGES[k])
    assert torch.equal(solarize(IMAGES), torch.where(IMAGES >= 0.5, 1 - IMAGES, IMAGES))
    none = torch.zeros(N, dtype=torch.bool)
    assert on_selected(IMAGES, none, solarize) is IMAGES
    assert torch.equal(on_selected(IMAGES, ~none, solarize), solarize(IMAGES))


def test_a_view_draws_a_fixed_count_of_random_numbers_whatever_the_images():
    """The generator advances by the same count for any input, so what one view draws never
    shifts the draws of the next (masks, other views) with the data."""
    view = Augment(8, blur=0.5, solarize=0.5)
    states = []
    for images in (X, torch.zeros_like(X), torch.ones_like(X)):
        gen = torch.Generator().manual_seed(6)
        view(images, gen)
        states.append(gen.get_state())
    assert all(torch.equal(states[0], s) for s in states[1:])


def test_blur_matches_a_per_sample_separable_convolution():
    """Each image against numpy: reflect-padded, the normalised Gaussian of its own sigma
    convolved along the rows and then the columns, in float64."""
    sigma = torch.linspace(0.15, 1.0, N)
    got = gaussian_blur(IMAGES, sigma, 3)
    taps = np.arange(-3, 4)
    for k in range(N):
        kernel = np.exp(-0.5 * (taps / float(sigma[k])) ** 2)
        kernel /= kernel.sum()
        image = IMAGES[k].double().numpy()
        rows = np.pad(image, ((0, 0), (0, 0), (3, 3)), mode="reflect")
        rows = np.apply_along_axis(np.convolve, 2, rows, kernel, mode="valid")
        cols = np.pad(rows, ((0, 0), (3, 3), (0, 0)), mode="reflect")
        expected = np.apply_along_axis(np.convolve, 1, cols, kernel, mode="valid")
        assert np.allclose(got[k].numpy(), expected, atol=1e-6), k

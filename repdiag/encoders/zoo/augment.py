"""Batched image augmentations in torch, driven by an explicit ``torch.Generator``.

The objectives' view pipelines (SimCLR, Chen et al. 2020, appendix A; BYOL, Grill et al. 2020,
table 6, used by Barlow Twins and VICReg; DINO multi-crop, Caron et al. 2021) adapted to 64 px:
random resized crop with horizontal flip, colour jitter (brightness, contrast, saturation, hue),
grayscale, Gaussian blur and solarisation. Every random number is drawn on the CPU from the
caller's generator, a fixed count per call, so a run is reproducible whatever the device.
Images are float (B, 3, H, W) in [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

LUMA = (0.299, 0.587, 0.114)  # ITU-R 601 luma weights, as torchvision's rgb_to_grayscale


def _uniform(gen: torch.Generator, n: int, low: float, high: float) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=gen, dtype=torch.float64)


def _bernoulli(gen: torch.Generator, n: int, p: float) -> torch.Tensor:
    return torch.rand(n, generator=gen) < p


def luminance(x: torch.Tensor) -> torch.Tensor:
    """(B, 1, H, W) luma ``0.299 R + 0.587 G + 0.114 B``."""
    w = x.new_tensor(LUMA).view(1, 3, 1, 1)
    return (x * w).sum(dim=1, keepdim=True)


def resized_crop(
    x: torch.Tensor,
    size: int,
    scale: torch.Tensor,
    log_ratio: torch.Tensor,
    centre: torch.Tensor,
    flip: torch.Tensor,
) -> torch.Tensor:
    """Crop per sample (area fraction ``scale``, aspect ``exp(log_ratio)``, ``centre`` in [0, 1]^2
    of the free room), optionally mirror, and resample bilinearly to ``size`` x ``size``."""
    ratio = torch.exp(log_ratio)
    width = torch.sqrt(scale * ratio).clamp(max=1.0)
    height = torch.sqrt(scale / ratio).clamp(max=1.0)
    cx = (2 * centre[:, 0] - 1) * (1 - width)  # normalised [-1, 1] coordinates of the crop centre
    cy = (2 * centre[:, 1] - 1) * (1 - height)
    sign = torch.where(flip, -1.0, 1.0).to(width.dtype)
    theta = torch.zeros(x.shape[0], 2, 3, dtype=torch.float64)
    theta[:, 0, 0] = width * sign
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = height
    theta[:, 1, 2] = cy
    theta = theta.to(device=x.device, dtype=x.dtype)
    grid = F.affine_grid(theta, [x.shape[0], x.shape[1], size, size], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def adjust_hue(x: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Rotate chroma by ``turns`` of a full circle in YIQ space (luma is kept)."""
    to_yiq = x.new_tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
    yiq = torch.einsum("ij,bjhw->bihw", to_yiq, x)
    angle = (2 * math.pi * turns).to(x.device, x.dtype).view(-1, 1, 1)
    cos, sin = torch.cos(angle), torch.sin(angle)
    i, q = yiq[:, 1], yiq[:, 2]
    yiq = torch.stack([yiq[:, 0], cos * i - sin * q, sin * i + cos * q], dim=1)
    return torch.einsum("ij,bjhw->bihw", torch.linalg.inv(to_yiq), yiq).clamp(0, 1)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, radius: int) -> torch.Tensor:
    """Separable Gaussian blur with a per-sample ``sigma`` (pixels), reflect padding."""
    b, c, h, w = x.shape
    offsets = torch.arange(-radius, radius + 1, dtype=x.dtype, device=x.device)
    sigma = sigma.to(x.device, x.dtype).view(-1, 1)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = (kernel / kernel.sum(dim=1, keepdim=True)).repeat_interleave(c, dim=0)  # (b c, k)
    y = x.reshape(1, b * c, h, w)
    y = F.conv2d(
        F.pad(y, (radius, radius, 0, 0), mode="reflect"), kernel.view(b * c, 1, 1, -1), groups=b * c
    )
    y = F.conv2d(
        F.pad(y, (0, 0, radius, radius), mode="reflect"), kernel.view(b * c, 1, -1, 1), groups=b * c
    )
    return y.reshape(b, c, h, w)


def _blend(x: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``other + factor (x - other)`` clamped to [0, 1] (torchvision's ``_blend``)."""
    f = factor.to(x.device, x.dtype).view(-1, 1, 1, 1)
    return (other + f * (x - other)).clamp(0, 1)


def _where(mask: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.to(a.device).view(-1, 1, 1, 1), a, b)


@dataclass(frozen=True)
class Augment:
    """One view pipeline; probabilities are per sample, magnitudes as in torchvision."""

    size: int
    crop_scale: tuple[float, float] = (0.25, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5
    jitter: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.2
    hue: float = 0.1
    grayscale: float = 0.2
    blur: float = 0.0
    blur_sigma: tuple[float, float] = (0.1, 1.0)
    solarize: float = 0.0

    def apply(self, x: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Augmented views of ``x`` and the (B,) bool mask of the mirrored samples."""
        n = x.shape[0]
        scale = _uniform(gen, n, *self.crop_scale)
        log_ratio = _uniform(gen, n, math.log(self.crop_ratio[0]), math.log(self.crop_ratio[1]))
        centre = torch.rand(n, 2, generator=gen, dtype=torch.float64)
        flip = _bernoulli(gen, n, self.flip)
        x = resized_crop(x, self.size, scale, log_ratio, centre, flip)
        jitter = _bernoulli(gen, n, self.jitter)
        brightness = _uniform(gen, n, 1 - self.brightness, 1 + self.brightness)
        contrast = _uniform(gen, n, 1 - self.contrast, 1 + self.contrast)
        saturation = _uniform(gen, n, 1 - self.saturation, 1 + self.saturation)
        hue = _uniform(gen, n, -self.hue, self.hue)
        grey = _bernoulli(gen, n, self.grayscale)
        blur = _bernoulli(gen, n, self.blur)
        sigma = _uniform(gen, n, *self.blur_sigma)
        solarize = _bernoulli(gen, n, self.solarize)
        if self.jitter > 0:
            y = _blend(x, torch.zeros_like(x), brightness)
            y = _blend(y, luminance(y).mean(dim=(1, 2, 3), keepdim=True), contrast)
            y = _blend(y, luminance(y), saturation)
            y = adjust_hue(y, hue) if self.hue > 0 else y
            x = _where(jitter, y, x)
        if self.grayscale > 0:
            x = _where(grey, luminance(x).expand_as(x), x)
        if self.blur > 0:
            radius = max(1, math.ceil(3 * self.blur_sigma[1]))
            x = _where(blur, gaussian_blur(x, sigma, radius), x)
        if self.solarize > 0:
            x = _where(solarize, torch.where(x >= 0.5, 1 - x, x), x)
        return x, flip

    def __call__(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return self.apply(x, gen)[0]


def simclr_view(size: int) -> Augment:
    """SimCLR (Chen et al. 2020): crop 0.08-1 (0.25 here, objects are small), flip, jitter
    (0.4, 0.4, 0.4, 0.1) with p 0.8, grayscale p 0.2, blur p 0.5."""
    return Augment(size, saturation=0.4, blur=0.5)


def byol_views(size: int) -> tuple[Augment, Augment]:
    """BYOL's asymmetric pair (Grill et al. 2020), used by Barlow Twins and VICReg:
    blur p 1.0 / 0.1, solarisation p 0 / 0.2, jitter (0.4, 0.4, 0.2, 0.1) p 0.8, grayscale 0.2."""
    return Augment(size, blur=1.0), Augment(size, blur=0.1, solarize=0.2)


def dino_views(size: int, local_size: int) -> tuple[Augment, Augment, Augment]:
    """DINO multi-crop (Caron et al. 2021): two global crops (0.4-1) with BYOL's asymmetric
    blur/solarisation, and small local crops (0.1-0.4) at ``local_size`` with blur p 0.5."""
    return (
        Augment(size, crop_scale=(0.4, 1.0), blur=1.0),
        Augment(size, crop_scale=(0.4, 1.0), blur=0.1, solarize=0.2),
        Augment(local_size, crop_scale=(0.1, 0.4), blur=0.5),
    )


def mae_view(size: int) -> Augment:
    """MAE (He et al. 2022): random resized crop 0.2-1 and flip only."""
    return Augment(size, crop_scale=(0.2, 1.0), jitter=0.0, grayscale=0.0)


def caption_safe_view(size: int) -> Augment:
    """Mild crop (0.8-1, aspect 0.9-1.1), no flip and no colour change: captions name colours and
    positions, so views must keep them true (CLIP trains with a random crop only)."""
    return Augment(
        size, crop_scale=(0.8, 1.0), crop_ratio=(0.9, 1.1), flip=0.0, jitter=0.0, grayscale=0.0
    )


def label_safe_view(size: int) -> Augment:
    """Supervised: no crop (slot labels depend on position), flip (labels are mirrored by the
    caller), colour jitter and grayscale (labels are shapes)."""
    return Augment(size, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), saturation=0.4)

"""Batched image augmentations in torch, driven by an explicit ``torch.Generator``.

The objectives' view pipelines (SimCLR, Chen et al. 2020, appendix A; BYOL, Grill et al. 2020,
table 6, used by Barlow Twins and VICReg; DINO multi-crop, Caron et al. 2021) adapted to 64 px:
random resized crop with horizontal flip, colour jitter (brightness, contrast, saturation, hue),
grayscale, Gaussian blur and solarisation. Every random number is drawn on the CPU from the
caller's generator, a fixed count per call, so a run is reproducible whatever the device.
Images are float (B, 3, H, W) in [0, 1].

Every step is one batched tensor operation over the whole batch, with no per-sample Python loop:
the crop samples a grid built by broadcasting (no affine-grid matrix product); saturation, hue
and grayscale are per-sample 3 x 3 colour matrices applied by one batched matrix product each
(the identity for a sample the step leaves alone, so such a sample passes through bit for bit);
blur (separable, one multiply-add per tap) and solarisation run on the selected samples only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

LUMA = (
    0.299,
    0.587,
    0.114,
)  # ITU-R 601 luma weights (torchvision's rgb_to_grayscale rounds 0.2989)
_RGB_TO_YIQ = ((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312))


def _uniform(gen: torch.Generator, n: int, low: float, high: float) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=gen, dtype=torch.float64)


def _bernoulli(gen: torch.Generator, n: int, p: float) -> torch.Tensor:
    return torch.rand(n, generator=gen) < p


def luminance(x: torch.Tensor) -> torch.Tensor:
    """(B, 1, H, W) luma ``0.299 R + 0.587 G + 0.114 B``."""
    w = x.new_tensor(LUMA).view(1, 3, 1, 1)
    return (x * w).sum(dim=1, keepdim=True)


@dataclass(frozen=True)
class Crop:
    """Per-sample crop draws, (B,) each (``centre`` (B, 2)): area fraction ``scale``, aspect
    ``exp(log_ratio)``, ``centre`` in [0, 1]^2 of the free room, mirrored where ``flip``."""

    scale: torch.Tensor
    log_ratio: torch.Tensor
    centre: torch.Tensor
    flip: torch.Tensor


def crop_grid(size: int, crop: Crop) -> torch.Tensor:
    """(B, size, size, 2) float64 sampling grid in normalised [-1, 1] coordinates (x, y) of
    ``crop``: output pixel (i, j) samples at ``(cx + w s u_j, cy + h u_i)``,
    ``u_k = (2 k + 1) / size - 1`` (align_corners=False), ``s = -1`` where mirrored."""
    ratio = torch.exp(crop.log_ratio)
    width = torch.sqrt(crop.scale * ratio).clamp(max=1.0)
    height = torch.sqrt(crop.scale / ratio).clamp(max=1.0)
    # normalised [-1, 1] coordinates of the crop centre
    cx = (2 * crop.centre[:, 0] - 1) * (1 - width)
    cy = (2 * crop.centre[:, 1] - 1) * (1 - height)
    sign = torch.where(crop.flip, -1.0, 1.0).to(width.dtype)
    u = (2 * torch.arange(size, dtype=torch.float64) + 1) / size - 1
    gx = cx[:, None] + (width * sign)[:, None] * u  # (B, size): varies along the columns
    gy = cy[:, None] + height[:, None] * u  # (B, size): varies along the rows
    n = gx.shape[0]
    return torch.stack(
        [gx[:, None, :].expand(n, size, size), gy[:, :, None].expand(n, size, size)], dim=-1
    )


def resized_crop(x: torch.Tensor, size: int, crop: Crop) -> torch.Tensor:
    """``crop`` per sample, resampled bilinearly (reflection padding) to ``size`` x ``size``:
    the affine crop of :func:`crop_grid`."""
    grid = crop_grid(size, crop).to(device=x.device, dtype=x.dtype)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def _mirror_only(x: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """The full-frame crop at the input's size: ``x`` mirrored where ``flip``."""
    mask = flip.to(x.device).view(-1, 1, 1, 1)
    return torch.where(mask, x.flip(-1), x)


def colour_matrix(x: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
    """``y[b, :, h, w] = M_b x[b, :, h, w]``: per-sample 3 x 3 colour matrices ``(B, 3, 3)``
    applied by one batched matrix product over the (B, 3, H W) pixels."""
    b, c, h, w = x.shape
    matrices = matrices.to(device=x.device, dtype=x.dtype)
    return torch.bmm(matrices, x.reshape(b, c, h * w)).view(b, c, h, w)


def saturation_matrices(factor: torch.Tensor) -> torch.Tensor:
    """(B, 3, 3) float64: ``s I + (1 - s) 1 w^T`` (w = :data:`LUMA`), the blend of a pixel with
    its grey ``lum(x) + s (x - lum(x))`` as a matrix."""
    luma = torch.tensor(LUMA, dtype=torch.float64)
    grey = luma.expand(3, 3)  # every row w^T: each channel becomes the luma
    s = factor.to(torch.float64).view(-1, 1, 1)
    return s * torch.eye(3, dtype=torch.float64) + (1 - s) * grey


def hue_matrices(turns: torch.Tensor) -> torch.Tensor:
    """(B, 3, 3) float64: ``T^-1 R(2 pi turns) T`` with ``T`` RGB -> YIQ and ``R`` the rotation of
    the (I, Q) chroma plane; luma is kept."""
    to_yiq = torch.tensor(_RGB_TO_YIQ, dtype=torch.float64)
    angle = 2 * math.pi * turns.to(torch.float64)
    cos, sin = torch.cos(angle), torch.sin(angle)
    rotation = torch.zeros(turns.shape[0], 3, 3, dtype=torch.float64)
    rotation[:, 0, 0] = 1.0
    rotation[:, 1, 1], rotation[:, 1, 2] = cos, -sin
    rotation[:, 2, 1], rotation[:, 2, 2] = sin, cos
    return torch.linalg.inv(to_yiq) @ rotation @ to_yiq


def adjust_hue(x: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Rotate chroma by ``turns`` of a full circle in YIQ space (luma is kept), clamped to [0, 1]."""
    return colour_matrix(x, hue_matrices(turns)).clamp_(0, 1)


def colour_jitter(
    x: torch.Tensor,
    brightness: torch.Tensor,
    contrast: torch.Tensor,
    saturation: torch.Tensor,
    hue: torch.Tensor | None,
    selected: torch.Tensor,
) -> torch.Tensor:
    """torchvision's jitter order with per-sample factors, on the ``selected`` samples (the
    others pass through unchanged), each step clamped to [0, 1]: brightness ``b x``, contrast
    ``c x + (1 - c) mean(lum x)``, saturation ``lum x + s (x - lum x)``, then the hue rotation
    (skipped for ``hue=None``)."""
    keep = ~selected
    one = torch.ones_like(brightness)
    b = torch.where(keep, one, brightness).to(x.device, x.dtype).view(-1, 1, 1, 1)
    c = torch.where(keep, one, contrast).to(x.device, x.dtype).view(-1, 1, 1, 1)
    y = (x * b).clamp_(0, 1)
    mean = luminance(y.mean(dim=(2, 3), keepdim=True))  # mean luma = luma of the mean colour
    y = torch.addcmul((1 - c) * mean, y, c).clamp_(0, 1)
    identity = torch.eye(3, dtype=torch.float64).expand(x.shape[0], 3, 3)
    matrices = torch.where(keep.view(-1, 1, 1), identity, saturation_matrices(saturation))
    y = colour_matrix(y, matrices).clamp_(0, 1)
    if hue is not None:
        matrices = torch.where(keep.view(-1, 1, 1), identity, hue_matrices(hue))
        y = colour_matrix(y, matrices).clamp_(0, 1)
    return y


def grayscale(x: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """The luma in every channel of the ``selected`` samples; the others unchanged."""
    identity = torch.eye(3, dtype=torch.float64).expand(x.shape[0], 3, 3)
    grey = torch.tensor(LUMA, dtype=torch.float64).expand(x.shape[0], 3, 3)
    return colour_matrix(x, torch.where(selected.view(-1, 1, 1), grey, identity))


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, radius: int) -> torch.Tensor:
    """Separable Gaussian blur with a per-sample ``sigma`` (pixels), reflect padding: along the
    rows, then the columns, ``y = sum_t k_t x[.. + t - radius]`` with the normalised kernel
    ``k_t ~ exp(-(t - radius)^2 / (2 sigma^2))``, one fused multiply-add over the batch per tap."""
    b, _, h, w = x.shape
    offsets = torch.arange(-radius, radius + 1, dtype=x.dtype, device=x.device)
    kernel = torch.exp(-0.5 * (offsets / sigma.to(x.device, x.dtype).view(-1, 1)) ** 2)
    kernel = (kernel / kernel.sum(dim=1, keepdim=True)).view(b, 1, 1, 1, -1)
    padded = F.pad(x, (radius, radius, 0, 0), mode="reflect")
    rows = padded[..., 0:w] * kernel[..., 0]
    for t in range(1, 2 * radius + 1):
        rows.addcmul_(padded[..., t : t + w], kernel[..., t])
    padded = F.pad(rows, (0, 0, radius, radius), mode="reflect")
    out = padded[:, :, 0:h] * kernel[..., 0]
    for t in range(1, 2 * radius + 1):
        out.addcmul_(padded[:, :, t : t + h], kernel[..., t])
    return out


def solarize(x: torch.Tensor) -> torch.Tensor:
    """``1 - x`` where ``x >= 0.5``, else ``x``: on [0, 1] that is ``min(x, 1 - x)``."""
    return torch.minimum(x, 1 - x)


def on_selected(
    x: torch.Tensor,
    selected: torch.Tensor,
    fn: Callable[..., torch.Tensor],
    *args: torch.Tensor,
) -> torch.Tensor:
    """``fn`` applied to the ``selected`` samples only (per-sample ``args`` indexed alike);
    the batch unchanged when none is selected, ``fn`` on all of it when all are."""
    if not bool(selected.any()):
        return x
    if bool(selected.all()):
        return fn(x, *args)
    index = torch.nonzero(selected).view(-1)
    moved = index.to(x.device)
    return x.index_copy(0, moved, fn(x.index_select(0, moved), *(a[index] for a in args)))


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

    def full_frame(self, x: torch.Tensor) -> bool:
        """Whether every crop of ``x`` is the whole image at its own size (scale and aspect 1)."""
        fixed = self.crop_scale == (1.0, 1.0) and self.crop_ratio == (1.0, 1.0)
        return fixed and x.shape[-1] == x.shape[-2] == self.size

    def apply(self, x: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Augmented views of ``x`` and the (B,) bool mask of the mirrored samples."""
        n = x.shape[0]
        scale = _uniform(gen, n, *self.crop_scale)
        log_ratio = _uniform(gen, n, math.log(self.crop_ratio[0]), math.log(self.crop_ratio[1]))
        centre = torch.rand(n, 2, generator=gen, dtype=torch.float64)
        flip = _bernoulli(gen, n, self.flip)
        if self.full_frame(x):  # the crop is the identity or a mirror: index, don't resample
            x = _mirror_only(x, flip)
        else:
            x = resized_crop(x, self.size, Crop(scale, log_ratio, centre, flip))
        jitter = _bernoulli(gen, n, self.jitter)
        brightness = _uniform(gen, n, 1 - self.brightness, 1 + self.brightness)
        contrast = _uniform(gen, n, 1 - self.contrast, 1 + self.contrast)
        saturation = _uniform(gen, n, 1 - self.saturation, 1 + self.saturation)
        hue = _uniform(gen, n, -self.hue, self.hue)
        grey = _bernoulli(gen, n, self.grayscale)
        blur = _bernoulli(gen, n, self.blur)
        sigma = _uniform(gen, n, *self.blur_sigma)
        solar = _bernoulli(gen, n, self.solarize)
        if self.jitter > 0 and bool(jitter.any()):
            hue_turns = hue if self.hue > 0 else None
            x = colour_jitter(x, brightness, contrast, saturation, hue_turns, jitter)
        if self.grayscale > 0 and bool(grey.any()):
            x = grayscale(x, grey)
        if self.blur > 0:
            radius = max(1, math.ceil(3 * self.blur_sigma[1]))
            x = on_selected(x, blur, lambda y, s: gaussian_blur(y, s, radius), sigma)
        if self.solarize > 0:
            x = on_selected(x, solar, solarize)
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

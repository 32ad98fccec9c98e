"""The zoo's training step as it was before the zoo speed-up (commit 482f62e), kept as the baseline of
benchmarks/zoo.py: measured side by side with the current step in one process.

What the old step did that the new one does not: augmentations built an affine grid by a
batched matrix product, ran every colour operation on the whole batch and selected with
``torch.where`` (hue by two einsums and a matrix inverse per call), blurred and solarised every
sample; the backbone ran in NCHW; each step rendered its scenes in the loop, read the loss to the
host twice (``isfinite`` and ``float``), stepped a per-tensor AdamW and updated DINO's teacher
tensor by tensor. The objectives' modules (backbones, heads, losses) are the current ones:
:func:`baseline` swaps the views for the copies below, the layout back to NCHW, the optimiser
for the unfused one and DINO's loss and teacher update for the old ones.
"""

from __future__ import annotations

import dataclasses
import math
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from repdiag.encoders.zoo.objectives.dino import dino_loss, teacher_momentum, update_center
from repdiag.encoders.zoo.regulariser import RegulariserSettings
from repdiag.encoders.zoo.scenes import scene_batch
from repdiag.encoders.zoo.train import (
    build_objective,
    learning_rate,
    parameter_groups,
    to_batch,
)

# --- the old augment.py, verbatim from here to the view factories ------------------------------
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


# --- the old step --------------------------------------------------------------------------------

VIEW_ATTRIBUTES = ("view", "views", "global_a", "global_b", "local")


def old_view(view):
    """The old pipeline with the same settings as ``view`` (a current Augment or a tuple)."""
    if isinstance(view, tuple):
        return tuple(old_view(v) for v in view)
    return Augment(**dataclasses.asdict(view))


def old_dino_loss(self, batch, gen: torch.Generator) -> torch.Tensor:
    """DINO's loss as it was: the global crops concatenated twice (teacher and student)."""
    images = batch.images
    globals_ = [
        self.normalize(self.global_a(images, gen)),
        self.normalize(self.global_b(images, gen)),
    ]
    locals_ = [self.normalize(self.local(images, gen)) for _ in range(self.n_local_crops)]
    with torch.no_grad():
        teacher = self.teacher_head(self.teacher_backbone(torch.cat(globals_))).chunk(2)
    student = list(self.head(self.backbone(torch.cat(globals_))).chunk(2))
    if locals_:
        student += list(self.head(self.backbone(torch.cat(locals_))).chunk(len(locals_)))
    with torch.no_grad():
        if not self.center_ready:
            self.center.copy_(torch.cat(teacher).mean(dim=0, keepdim=True))
            self.center_ready = True
    loss = dino_loss(student, list(teacher), self.center, *self.temps)
    with torch.no_grad():
        self.center.copy_(update_center(self.center, list(teacher), self.center_momentum))
    return loss


@torch.no_grad()
def old_dino_after_step(self, step: int, total_steps: int) -> None:
    """DINO's teacher EMA as it was: tensor by tensor."""
    m = teacher_momentum(step, total_steps, self.base_momentum)
    pairs = [(self.teacher_backbone, self.backbone), (self.teacher_head, self.head)]
    for teacher, student in pairs:
        for pt, ps in zip(teacher.parameters(), student.parameters(), strict=True):
            pt.mul_(m).add_(ps.detach(), alpha=1 - m)
        for bt, bs in zip(teacher.buffers(), student.buffers(), strict=True):
            bt.copy_(bs)


def baseline(spec: dict) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The run's objective and optimiser as the old step had them (module docstring)."""
    objective, _ = build_objective(spec, "cpu")
    objective.use_memory_format(torch.contiguous_format)
    for name in VIEW_ATTRIBUTES:
        if hasattr(objective, name):
            setattr(objective, name, old_view(getattr(objective, name)))
    if objective.name == "dino":
        objective.loss = types.MethodType(old_dino_loss, objective)
        objective.after_step = types.MethodType(old_dino_after_step, objective)
    objective.train()
    optimizer = torch.optim.AdamW(parameter_groups(objective, spec["weight_decay"]), lr=spec["lr"])
    return objective, optimizer


def old_train_step(objective, optimizer, spec: dict, step: int, gen: torch.Generator) -> float:
    """The old train_step (without the JER regulariser, which no benchmarked run uses)."""
    steps = spec["steps"]
    device = objective.pixel_mean.device
    batch = to_batch(
        scene_batch(objective.scenes, spec["scenes"]["seed"], step, spec["batch_size"]), device
    )
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, steps, spec["lr"], spec["warmup_fraction"])
    loss = objective.loss(batch, gen)
    total = loss
    assert not RegulariserSettings.of(spec).acts(step, spec["steps"]), "the baseline has no push"
    if not torch.isfinite(total):
        raise FloatingPointError(f"the {spec['objective']} loss is {total.item()} at step {step}")
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    objective.before_update(step, steps)
    if spec["grad_clip"] > 0:
        nn.utils.clip_grad_norm_(
            [p for _, p in objective.trainable_parameters()], spec["grad_clip"]
        )
    optimizer.step()
    objective.after_step(step, steps)
    return float(loss.detach())

"""Seeded SimCLR training with the NT-Xent loss, and frozen features for the linear probe.

Each step takes a batch of N images, two random views of each (:class:`~repdiag.cifar.views.TwoViews`
in DataLoader workers), z = g(f(x)) for all 2N views, and one AdamW step on NT-Xent (Chen et al.
2020, eq. 1):

    l(i, j) = -log exp(sim(z_i, z_j) / tau) / sum_{k != i} exp(sim(z_i, z_k) / tau),

averaged over the 2N anchors, with sim the cosine similarity and j the other view of i; the
loss is :func:`repdiag.encoders.zoo.objectives.simclr.nt_xent_loss`, the project's one NT-Xent
(the InfoNCE of :mod:`repdiag.identifiability.losses` takes explicit negatives, not the in-batch form).
The learning rate warms up linearly, then follows a cosine decay to zero (SimCLR). Weight decay
skips biases and normalisation weights. On CUDA the forward pass runs in bfloat16 autocast
(``amp``); the loss is computed in float32.

Seeding: the caller seeds torch before building the model; the DataLoader's shuffling and its
workers' augmentation RNGs derive from ``torch.Generator().manual_seed(seed)``, so a run is
reproducible for a given device and number of loader workers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from repdiag.cifar.views import TwoViews
from repdiag.core.errors import ConfigError
from repdiag.core.runtime import Progress
from repdiag.core.settings import FromConfig
from repdiag.encoders.zoo.objectives.simclr import nt_xent_loss

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SimCLRSettings(FromConfig):
    """``cifar.train`` (plain values) plus the architecture's learning rate."""

    SECTION = "cifar.train"

    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup_epochs: float
    temperature: float
    amp: bool
    max_steps: int | None
    log_every: int

    def __post_init__(self) -> None:
        if self.batch_size < 2:
            raise ConfigError("cifar.train.batch_size must be >= 2 (NT-Xent needs negatives)")
        if self.temperature <= 0:
            raise ConfigError(f"cifar.train.temperature must be > 0, got {self.temperature}")


@dataclasses.dataclass
class SimCLRRun:
    curve: list[tuple[int, float, float]]  # (step, mean loss since the previous entry, lr)
    initial_loss: float
    final_loss: float  # mean over the last 10 % of steps
    steps: int
    epochs: float
    wall_time_s: float
    steps_per_s: float
    images_per_s: float


def planned_steps(n_images: int, settings: SimCLRSettings) -> tuple[int, int]:
    """(steps per epoch, total steps): full batches only, capped by ``max_steps``."""
    per_epoch = n_images // settings.batch_size
    if per_epoch == 0:
        raise ConfigError(
            f"cifar.train.batch_size = {settings.batch_size} exceeds the {n_images} training "
            "images: lower it or raise cifar.n_train"
        )
    total = per_epoch * settings.epochs
    if settings.max_steps is not None:
        total = min(total, settings.max_steps)
    return per_epoch, total


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Multiplier of the base lr at ``step`` (0-based): (step + 1) / warmup during the warmup,
    then 0.5 (1 + cos(pi t)) with t the fraction of the remaining steps done."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: ``weight_decay`` on weight matrices and kernels, none on biases and norms."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def train_simclr(
    model: nn.Module,
    images: torch.Tensor,
    view: Callable[[torch.Tensor], torch.Tensor],
    settings: SimCLRSettings,
    *,
    seed: int,
    device: torch.device | str = "cpu",
    workers: int = 0,
) -> SimCLRRun:
    """Train ``model`` (x -> (h, z)) in place on uint8 ``images`` (N, 3, H, W) with NT-Xent."""
    device = torch.device(device)
    per_epoch, total = planned_steps(len(images), settings)
    warmup = min(total, round(settings.warmup_epochs * per_epoch))
    loader = DataLoader(
        TwoViews(images, view),
        batch_size=settings.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(seed),
        persistent_workers=workers > 0,
        pin_memory=device.type == "cuda",
    )
    model.to(device).train()
    optimizer = torch.optim.AdamW(param_groups(model, settings.weight_decay), lr=settings.lr)
    use_amp = settings.amp and device.type == "cuda"
    progress = Progress(total, "SimCLR steps")
    losses: list[float] = []
    curve: list[tuple[int, float, float]] = []
    window: list[float] = []
    start = time.monotonic()
    step = 0
    while step < total:
        for x1, x2 in loader:
            lr = settings.lr * lr_factor(step, total, warmup)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x = torch.cat([x1, x2]).to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
                _, z = model(x)
            z1, z2 = z.float().chunk(2)
            loss = nt_xent_loss(z1, z2, settings.temperature)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(
                    f"SimCLR loss became {value} at step {step + 1}: lower cifar.train.lr "
                    "(or this architecture's cifar.encoders.<name>.lr)"
                )
            losses.append(value)
            window.append(value)
            step += 1
            progress.update()
            if step % settings.log_every == 0 or step == total:
                curve.append((step, float(np.mean(window)), lr))
                window = []
            if step >= total:
                break
    wall = time.monotonic() - start
    tail = losses[-max(1, len(losses) // 10) :]
    return SimCLRRun(
        curve=curve,
        initial_loss=losses[0],
        final_loss=float(np.mean(tail)),
        steps=total,
        epochs=total / per_epoch,
        wall_time_s=wall,
        steps_per_s=total / max(wall, 1e-9),
        images_per_s=total * settings.batch_size / max(wall, 1e-9),
    )


@torch.no_grad()
def extract_features(
    encoder: nn.Module,
    images: torch.Tensor,
    transform: Callable[[torch.Tensor], torch.Tensor],
    *,
    device: torch.device | str = "cpu",
    batch_size: int,
) -> np.ndarray:
    """Frozen representations h = f(x) (eval mode, float32) of uint8 ``images`` (N, 3, H, W)."""
    encoder.to(device).eval()
    chunks = []
    for start in range(0, len(images), batch_size):
        x = transform(images[start : start + batch_size]).to(device)
        chunks.append(encoder(x).float().cpu().numpy())
    features = np.concatenate(chunks)
    bad = int(features.size - np.count_nonzero(np.isfinite(features)))
    if bad:
        raise FloatingPointError(f"{bad} non-finite feature values: the encoder diverged")
    return features

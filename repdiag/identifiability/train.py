"""Seeded contrastive training on sphere latents: fresh samples every step (infinite data).

Each step draws a batch of anchors z ~ U(S^(d-1)), one positive per anchor (full-support vMF or
restricted support), M negatives (uniform and shared, or, for the support-corrected loss, a
fraction ``ratio`` drawn on the anchor's sub-manifold and shared within its group of anchors),
maps everything through the frozen generator and the encoder, and takes one Adam step on the
loss. The learning rate follows a cosine decay
to zero over the run (``lr_schedule`` "cosine") or stays constant ("constant", the setting of
Zimmermann et al. 2021). Encoders with ``separate_views`` (the paper's MLP) see anchors,
positives and negatives in separate passes (:func:`encode_views`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import numpy as np
import torch
from torch import nn

from repdiag.core.errors import ConfigError
from repdiag.core.runtime import Progress
from repdiag.identifiability.losses import info_nce, split_negatives, support_corrected_info_nce
from repdiag.identifiability.sphere import (
    Generator,
    sample_positives,
    sample_submanifold_uniform,
    sample_uniform,
)

log = logging.getLogger(__name__)

LOSSES = ("infonce", "support_corrected")
LR_SCHEDULES = ("cosine", "constant")


@dataclasses.dataclass(frozen=True)
class ContrastiveSettings:
    """What one training run uses (all plain values, straight from the config: built by
    :func:`repdiag.identifiability.study.train_settings` from a cell's resolved parameters; the
    schema is where every default lives)."""

    steps: int
    batch_size: int
    n_negatives: int
    lr: float
    temperature: float
    similarity: str
    loss: str
    ratio: float
    sampling: str
    kappa: float
    n_fixed: int
    group_size: int
    log_every: int
    lr_schedule: str

    def __post_init__(self) -> None:
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(
                f"identifiability.train.lr_schedule must be one of {LR_SCHEDULES}, "
                f"got {self.lr_schedule!r}"
            )
        if self.loss not in LOSSES:
            raise ConfigError(f"identifiability loss must be one of {LOSSES}, got {self.loss!r}")
        if self.loss == "infonce" and self.ratio != 0.0:
            raise ConfigError(
                "identifiability: a constrained-negative ratio needs loss support_corrected"
            )
        split_negatives(self.n_negatives, self.ratio)  # validates the ratio
        if self.loss == "support_corrected":
            if self.sampling != "restricted":
                raise ConfigError(
                    "identifiability: loss support_corrected needs sampling 'restricted' (with full "
                    "support the positive pair's sub-manifold is the whole sphere)"
                )
            if self.batch_size % self.group_size:
                raise ConfigError(
                    f"identifiability.train.batch_size ({self.batch_size}) must be a multiple of "
                    f"identifiability.loss.group_size ({self.group_size})"
                )


@dataclasses.dataclass
class ContrastiveRun:
    curve: list[tuple[int, float]]
    final_loss: float
    wall_time_s: float
    steps_per_s: float


def _tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(array.astype(np.float32)).to(device)


def _sample_anchors(
    settings: ContrastiveSettings, dim: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray | None]:
    """Anchors z ~ U(S^(d-1)); for the support-corrected loss also their group centres.

    Support-corrected batches come in groups of ``group_size`` anchors that share the fixed
    coordinates u: a centre is drawn uniformly and its members uniformly on the centre's
    sub-manifold {z : z_u = u}, so every anchor is still exactly uniform on the sphere while a
    group can share its constrained negatives (one encoder pass per group, not per anchor).
    """
    if settings.loss != "support_corrected":
        return sample_uniform(settings.batch_size, dim, rng), None
    centres = sample_uniform(settings.batch_size // settings.group_size, dim, rng)
    anchors = sample_submanifold_uniform(centres, settings.n_fixed, settings.group_size, rng)
    return anchors.reshape(-1, dim), centres


def contrastive_step_loss(
    encoder: nn.Module,
    generator: Generator,
    settings: ContrastiveSettings,
    rng: np.random.Generator,
    device: torch.device | str,
) -> torch.Tensor:
    """The loss on one freshly sampled batch (differentiable w.r.t. the encoder)."""
    dim = generator.latent_dim
    z, centres = _sample_anchors(settings, dim, rng)
    z_pos = sample_positives(z, settings.sampling, settings.kappa, settings.n_fixed, rng)
    n_con, n_uni = (
        split_negatives(settings.n_negatives, settings.ratio)
        if settings.loss == "support_corrected"
        else (0, settings.n_negatives)
    )
    batch = [z, z_pos, sample_uniform(n_uni, dim, rng)]
    if n_con:
        batch.append(
            sample_submanifold_uniform(centres, settings.n_fixed, n_con, rng).reshape(-1, dim)
        )
    device = torch.device(device)
    with torch.no_grad():
        xs = [generator(_tensor(part, device)) for part in batch]
    h = encode_views(encoder, xs)
    if settings.loss == "infonce":
        return info_nce(h[0], h[1], h[2], settings.temperature, settings.similarity)
    width = h[0].shape[1]
    if n_con:  # (groups, Mc, d): shared by the group_size consecutive anchors of each group
        constrained = h[3].reshape(-1, n_con, width)
    else:
        constrained = h[0].new_zeros((settings.batch_size, 0, width))
    return support_corrected_info_nce(
        h[0], h[1], constrained, h[2], settings.temperature, settings.similarity
    )


def encode_views(encoder: nn.Module, views: list[torch.Tensor]) -> list[torch.Tensor]:
    """f applied to each view: one pass per view when ``encoder.separate_views`` (BatchNorm
    statistics per view, as in the paper's encoder), else one pass over their concatenation.

    The views must not all be empty."""
    if getattr(encoder, "separate_views", False):
        outputs = {i: encoder(x) for i, x in enumerate(views) if len(x)}
        width = next(iter(outputs.values())).shape[1]
        # an empty view (no uniform negatives at ratio 1) has no batch statistics: skip it
        return [outputs.get(i, x.new_zeros((0, width))) for i, x in enumerate(views)]
    return list(torch.split(encoder(torch.cat(views)), [len(x) for x in views]))


def train_contrastive(
    encoder: nn.Module,
    generator: Generator,
    settings: ContrastiveSettings,
    *,
    seed: int,
    device: torch.device | str = "cpu",
) -> ContrastiveRun:
    """Train ``encoder`` in place on contrastive pairs from ``generator``; returns the loss curve.

    Data come from ``numpy.random.default_rng([seed, 23])`` (independent of the generator's and
    the encoder's streams). The curve holds the mean loss over each window of ``log_every`` steps.
    """
    device = torch.device(device)
    encoder.to(device).train()
    generator.to(device)
    rng = np.random.default_rng([seed, 23])
    optimiser = torch.optim.Adam(encoder.parameters(), lr=settings.lr)
    if settings.lr_schedule == "cosine":
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimiser, lambda step: 0.5 * (1.0 + math.cos(math.pi * step / settings.steps))
        )
    else:
        schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: 1.0)
    progress = Progress(settings.steps, "contrastive steps", logger=log)
    curve: list[tuple[int, float]] = []
    window: list[float] = []
    start = time.perf_counter()
    for step in range(1, settings.steps + 1):
        if hasattr(encoder, "set_progress"):
            encoder.set_progress((step - 1) / settings.steps)
        loss = contrastive_step_loss(encoder, generator, settings, rng, device)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"contrastive loss became {loss.item()} at step {step}; lower identifiability.train.lr"
            )
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        schedule.step()
        window.append(loss.item())
        if step % settings.log_every == 0 or step == settings.steps:
            curve.append((step, float(np.mean(window))))
            window.clear()
        progress.update()
    wall = time.perf_counter() - start
    if hasattr(encoder, "set_progress"):
        encoder.set_progress(1.0)
    encoder.eval()
    return ContrastiveRun(curve, curve[-1][1], wall, settings.steps / max(wall, 1e-9))


@torch.no_grad()
def encode_latents(
    encoder: nn.Module, generator: Generator, z: np.ndarray, device: torch.device | str = "cpu"
) -> np.ndarray:
    """h = f(g(z)) as a float64 array (evaluation)."""
    encoder.eval()
    h = encoder(generator(_tensor(z, torch.device(device))))
    return h.detach().cpu().double().numpy()

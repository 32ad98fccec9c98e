"""Training loop shared by every alignment method (Adam, unit-norm decoder, linear LR decay)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from repdiag.alignment.concepts import PairedData
from repdiag.alignment.methods import Batch, Method, PairModel
from repdiag.alignment.optim import Adam
from repdiag.alignment.topk import unit_mean_square_scale
from repdiag.core.errors import ConfigError
from repdiag.core.runtime import Progress
from repdiag.core.settings import FromConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SAETrainSettings(FromConfig):
    """``alignment.train``: the optimiser's settings, and the directions per sliced-Wasserstein
    estimate of the distributional losses (``sw_projections``, given to the method)."""

    SECTION = "alignment.train"

    steps: int
    batch_size: int
    pair_batch_size: int
    lr: float
    decay_fraction: float  # final fraction of steps with linear decay of the LR to 0
    sw_projections: int
    curve_every: int = 50


def normalise(data: PairedData) -> tuple[PairedData, tuple[float, float]]:
    """Divide each domain by its training scale ``sqrt(mean ||x||^2)`` (train and test alike)."""
    scales = tuple(unit_mean_square_scale(x) for x in data.train)
    train = tuple((x / s).astype(np.float32) for x, s in zip(data.train, scales, strict=True))
    test = tuple((x / s).astype(np.float32) for x, s in zip(data.test, scales, strict=True))
    truth = replace(data.truth, scales=scales) if data.truth is not None else None
    return replace(data, train=train, test=test, truth=truth), scales  # type: ignore[arg-type]


class BatchSampler:
    """Independent random rows of each domain, plus a random subset of the anchor pairs.

    Every method gets the same budget of ``batch_size + pair_batch_size`` rows per domain per
    step (see :func:`batch_sizes`).
    """

    def __init__(
        self,
        data: PairedData,
        settings: SAETrainSettings,
        generator: torch.Generator,
        device: torch.device,
    ) -> None:
        self.x = [torch.as_tensor(x, device=device) for x in data.train]
        self.n_paired = data.n_paired
        self.settings, self.generator = settings, generator

    def _rows(self, n: int, size: int) -> torch.Tensor:
        if size >= n:
            return torch.randperm(n, generator=self.generator)
        return torch.randint(n, (size,), generator=self.generator)

    def pairs(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.n_paired == 0:
            return None
        rows = self._rows(self.n_paired, self.settings.pair_batch_size)
        return self.x[0][rows], self.x[1][rows]

    def pairs_of(self, size: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.n_paired == 0:
            return None
        rows = self._rows(self.n_paired, size)
        return self.x[0][rows], self.x[1][rows]

    def __call__(self, with_pairs: bool, unpaired: int | None = None, paired: int = 0) -> Batch:
        size = self.settings.batch_size if unpaired is None else unpaired
        pairs = (self.pairs_of(paired) if paired else self.pairs()) if with_pairs else None
        if size == 0 and pairs is not None:
            return Batch(x=pairs, pairs=pairs)  # pair-only methods read batch.pairs alone
        x = tuple(xi[self._rows(len(xi), size)] for xi in self.x)
        return Batch(x=x, pairs=pairs)  # type: ignore[arg-type]


def batch_sizes(method: Method, settings: SAETrainSettings) -> tuple[int, int]:
    """``(unpaired rows, anchor pairs)`` per domain per step: the same total for every method.

    Methods that train on pairs only (Crosscoder, USAE) get the whole budget
    ``batch_size + pair_batch_size`` as pairs, methods whose loss reads no pair (independent,
    SAE-A, CoSAE-distributional) as unpaired rows, CoSAE with pair terms ``batch_size`` +
    ``pair_batch_size``.
    """
    total = settings.batch_size + settings.pair_batch_size
    if method.needs_pairs and method.trains_on_pairs:
        return 0, total
    if method.trains_on_pairs:
        return settings.batch_size, settings.pair_batch_size
    return total, 0


def _learning_rate(settings: SAETrainSettings, step: int) -> float:
    decay_start = int(settings.steps * (1 - settings.decay_fraction))
    if step < decay_start:
        return settings.lr
    return settings.lr * (settings.steps - step) / max(1, settings.steps - decay_start)


@dataclass
class SAERun:
    model: PairModel
    curve: list[dict]
    final_terms: dict[str, float]
    wall_time_s: float
    finalise_info: dict


def train_method(
    method: Method,
    data: PairedData,
    settings: SAETrainSettings,
    *,
    seed: int,
    device: torch.device | str = "cpu",
) -> SAERun:
    """Train ``method`` on normalised ``data``; pairs are the first ``data.n_paired`` rows."""
    device = torch.device(device)
    if method.needs_pairs and data.n_paired == 0:
        raise ConfigError(
            f"method {method.name!r} needs paired rows but the paired fraction gives none"
        )
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = method.build([x.shape[1] for x in data.train], generator).to(device)
    for sae, x in zip(model.saes, data.train, strict=True):
        sae.init_decoder_bias(
            torch.as_tensor(x[: data.n_paired] if method.needs_pairs else x, device=device)
        )
    sampler = BatchSampler(data, settings, generator, device)
    unpaired, paired = batch_sizes(method, settings)
    if method.per_model_update:  # one Adam per domain's SAE; only the active one steps
        optimisers = [Adam(sae.parameters(), lr=settings.lr) for sae in model.saes]
    else:
        optimisers = [Adam(model.parameters(), lr=settings.lr)]
    progress = Progress(settings.steps, f"training {method.name}")
    curve, running = [], {}
    start = time.monotonic()
    for step in range(settings.steps):
        batch = sampler(with_pairs=paired > 0, unpaired=unpaired, paired=paired)
        terms = method.loss_terms(model, batch, generator)
        loss = sum(method.weight(name) * value for name, value in terms.items())
        for optimiser in optimisers:
            optimiser.lr = _learning_rate(settings, step)
            optimiser.zero_grad()
        loss.backward()
        for sae in model.saes:
            sae.remove_parallel_grad()
        if method.per_model_update:
            optimisers[method.active_model].step()
        else:
            optimisers[0].step()
        for sae in model.saes:
            sae.normalise_decoder()
        for name, value in terms.items():
            running[name] = running.get(name, 0.0) + float(value.detach())
        if (step + 1) % settings.curve_every == 0 or step + 1 == settings.steps:
            n = (
                settings.curve_every
                if (step + 1) % settings.curve_every == 0
                else (step + 1) % settings.curve_every
            )
            curve.append({"step": step + 1, **{k: v / n for k, v in running.items()}})
            running = {}
        progress.update()
    if not all(np.isfinite(v) for v in curve[-1].values()):
        raise FloatingPointError(f"training {method.name} diverged: final losses {curve[-1]}")
    pairs = None
    if method.uses_pairs and data.n_paired:
        pairs = tuple(torch.as_tensor(x[: data.n_paired], device=device) for x in data.train)
    model.eval()
    info = method.finalise(model, pairs)  # type: ignore[arg-type]
    final = {k: v for k, v in curve[-1].items() if k != "step"}
    return SAERun(model, curve, final, time.monotonic() - start, info)

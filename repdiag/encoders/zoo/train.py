"""The seeded, deterministic training loop of one zoo run.

Same spec, same thread count, same device type -> the same weights, bit for bit: the weights are
initialised after ``torch.manual_seed(seed)``, batch ``t`` of the scene stream is a pure function
of ``(scenes.seed, t)`` (rendered ahead in a worker thread, :mod:`repdiag.encoders.zoo.stream`,
the same bytes as in the loop), and every augmentation and mask is drawn from one CPU generator
seeded with ``seed``. AdamW (fused) with linear warmup and cosine decay to 0; decoupled weight
decay on weight matrices only; the global gradient norm clipped. Inputs are normalised with the
per-channel mean and standard deviation of the stream's first 512 scenes (recorded in
``meta.json["preprocess"]``). A ConvNet trains in the channels_last layout on the CPU
(:func:`repdiag.encoders.zoo.backbones.memory_format`); the saved weights are contiguous.

The step never waits for the device: the losses stay on it and are read every
:data:`READ_EVERY` steps (:class:`LossLog`), where a non-finite loss stops the run naming its step.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from repdiag.core.runtime import Progress
from repdiag.encoders.zoo.allocator import keep_freed_memory
from repdiag.encoders.zoo.backbones import backbone_kwargs, build_backbone, memory_format
from repdiag.encoders.zoo.heads import MLPHead
from repdiag.encoders.zoo.learning import learning_record, plateau_check, probe_check
from repdiag.encoders.zoo.objectives import OBJECTIVES, Batch, Objective
from repdiag.encoders.zoo.regulariser import (
    Regulariser,
    RegulariserSettings,
    clip_coefficient,
    probe_generator,
    term_value,
)
from repdiag.encoders.zoo.run_meta import run_meta, steps_trained
from repdiag.encoders.zoo.saved import Snapshot, Snapshots, checkpoint_spec
from repdiag.encoders.zoo.scenes import SceneSettings, channel_statistics, scene_batch
from repdiag.encoders.zoo.stream import Prefetcher, to_batch

log = logging.getLogger(__name__)

NO_DECAY_SUFFIXES = ("pos_embed", "cls_token", "mask_token", "position", "log_scale")
READ_EVERY = 25  # steps between reads of the losses kept on the device (one host sync each)
PREFETCH_DEPTH = 2  # batches rendered ahead of the step


@dataclass
class TrainResult:
    """The trained encoder (backbone, head), its meta.json content, the loss per step and, for a
    regularised run, its cumulative push (repdiag.encoders.zoo.regulariser)."""

    backbone: nn.Module
    head: MLPHead | None
    meta: dict[str, Any]
    losses: list[float]
    push: dict[str, torch.Tensor] | None = None
    """The regulariser's cumulative push P per backbone parameter (None: no regulariser)."""
    saved: dict[int, TrainResult] = field(default_factory=dict)
    """The steps of ``save_at``, each finished as its own run (repdiag.encoders.zoo.saved)."""


def build_objective(
    spec: Mapping[str, Any], device: torch.device | str
) -> tuple[Objective, dict[str, Any]]:
    """The objective module of ``spec`` (seeded init) on ``device``, in the backbone's fastest
    layout there (:func:`~repdiag.encoders.zoo.backbones.memory_format`), and the backbone's
    complete timm kwargs."""
    cls = OBJECTIVES.get(spec["objective"])
    scenes = SceneSettings.from_config(
        spec["scenes"], spec["image_size"], arrangement_groups=spec["arrangement_groups"]
    )
    kwargs = backbone_kwargs(
        spec["timm_model"], spec["timm_kwargs"], spec["image_size"], cls.backbone_extras
    )
    # normalised as the plain stream is, so arrangement groups change the batches and nothing else
    plain = replace(scenes, arrangement_groups=1)
    mean, std = channel_statistics(plain, spec["scenes"]["seed"])
    torch.manual_seed(spec["seed"])
    objective = cls(
        build_backbone(spec["timm_model"], kwargs), scenes, mean, std, **spec["hparams"]
    )
    objective = objective.to(device)
    return objective.use_memory_format(memory_format(objective.backbone, device)), kwargs


def parameter_groups(objective: Objective, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on matrices (ndim >= 2) except tokens and position embeddings."""
    decay, no_decay = [], []
    for name, param in objective.trainable_parameters():
        (decay if param.ndim >= 2 and not name.endswith(NO_DECAY_SUFFIXES) else no_decay).append(
            param
        )
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def learning_rate(step: int, total: int, peak: float, warmup_fraction: float) -> float:
    """Linear warmup over ``floor(total * warmup_fraction)`` steps, then cosine decay to 0."""
    warmup = int(total * warmup_fraction)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(objective: Objective, spec: Mapping[str, Any]) -> torch.optim.Optimizer:
    """AdamW over :func:`parameter_groups` at ``spec["lr"]``; the fused kernel on the CPU and
    CUDA (one pass over all parameters, 4x faster than the per-tensor loop on the zoo ResNet)."""
    device = objective.pixel_mean.device.type
    fused = {"fused": True} if device in ("cpu", "cuda") else {}
    return torch.optim.AdamW(
        parameter_groups(objective, spec["weight_decay"]), lr=spec["lr"], **fused
    )


def regularised_backward(
    objective: Objective,
    loss: torch.Tensor,
    batch: Batch,
    regulariser: Regulariser,
    step: int,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Set every trainable weight's gradient to the objective's, plus the regulariser's push on
    the backbone (repdiag.encoders.zoo.regulariser); returns the term's detached value and the
    push. The two gradients are taken apart: the sham's push depends on both."""
    value = term_value(
        objective, batch, regulariser.settings, probe_generator(regulariser.seed, step)
    )
    params = [p for _, p in objective.trainable_parameters()]
    objective_grads = torch.autograd.grad(loss, params, allow_unused=True)
    term_grads = torch.autograd.grad(value, regulariser.params, allow_unused=True)
    index = {id(p): k for k, p in enumerate(params)}
    backbone_objective = [objective_grads[index[id(p)]] for p in regulariser.params]
    push = regulariser.push(term_grads, backbone_objective)
    grads = list(objective_grads)
    for param, d in zip(regulariser.params, push, strict=True):
        k = index[id(param)]
        grads[k] = d.to(param.dtype) if grads[k] is None else grads[k] + d.to(param.dtype)
    for param, grad in zip(params, grads, strict=True):
        param.grad = None if grad is None else grad.detach()
    return value.detach(), push


def train_step(
    objective: Objective,
    optimizer: torch.optim.Optimizer,
    spec: Mapping[str, Any],
    step: int,
    gen: torch.Generator,
    jer_record: list[torch.Tensor] | None = None,
    batch: Batch | None = None,
    regulariser: Regulariser | None = None,
) -> torch.Tensor:
    """One optimiser step on batch ``step`` of the scene stream (rendered here unless handed
    in); returns the objective's loss, detached on the device and not read (no host sync),
    without the regulariser, whose detached term value is appended to ``jer_record``.
    ``regulariser``: the run's (built here from ``spec`` when it has a term and none is given;
    its cumulative push then covers this step only). A non-finite loss is the caller's to catch
    (:class:`LossLog`, :func:`check_finite`)."""
    steps = spec["steps"]
    if batch is None:
        scenes = scene_batch(objective.scenes, spec["scenes"]["seed"], step, spec["batch_size"])
        batch = to_batch(scenes, objective.pixel_mean.device)
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, steps, spec["lr"], spec["warmup_fraction"])
    loss = objective.loss(batch, gen)
    if regulariser is None and RegulariserSettings.of(spec).weight != 0.0:
        regulariser = Regulariser(spec, objective.backbone)
    acting = regulariser is not None and regulariser.acts(step)
    optimizer.zero_grad(set_to_none=True)
    if acting:
        value, push = regularised_backward(objective, loss, batch, regulariser, step)
        if jer_record is not None:
            jer_record.append(value)
        before = [p.detach().clone() for p in regulariser.params]
    else:
        loss.backward()
    objective.before_update(step, steps)
    trainable = [p for _, p in objective.trainable_parameters()]
    if acting:
        coefficient = clip_coefficient([p.grad for p in trainable], spec["grad_clip"])
    if spec["grad_clip"] > 0:
        nn.utils.clip_grad_norm_(trainable, spec["grad_clip"])
    optimizer.step()
    if acting:
        regulariser.accumulate(optimizer, push, coefficient, before)
    objective.after_step(step, steps)
    return loss.detach()


def check_finite(spec: Mapping[str, Any], step: int, value: float) -> None:
    """Raise FloatingPointError naming the run, the step and the fix if ``value`` (the loss of
    ``step``, or its JER estimate) is not finite."""
    if not math.isfinite(value):
        raise FloatingPointError(
            f"zoo run {spec['run']!r}: the {spec['objective']} loss is {value} at step {step}; "
            f"lower zoo.objectives.{spec['run']}.lr (now {spec['lr']}) or raise grad_clip"
        )


class LossLog:
    """The losses (and JER estimates) of a run, kept as device tensors and read to floats in
    blocks of :data:`READ_EVERY` steps (one host sync per block), checking each is finite."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec
        self.losses: list[float] = []
        self.estimates: list[float] = []
        self.pending: list[torch.Tensor] = []
        self.pending_estimates: list[tuple[int, torch.Tensor]] = []  # (step, estimate)

    def add(self, loss: torch.Tensor, estimates: Sequence[torch.Tensor] = ()) -> None:
        """Record the next step's loss and JER estimate (if the term acted); read the block
        when it is full."""
        step = len(self.losses) + len(self.pending)
        self.pending.append(loss)
        self.pending_estimates.extend((step, estimate) for estimate in estimates)
        if len(self.pending) >= READ_EVERY:
            self.read()

    def read(self) -> None:
        """Move the pending values to the host in one transfer; raise on the first non-finite."""
        if not self.pending:
            return
        first, n = len(self.losses), len(self.pending)
        values = torch.stack([*self.pending, *(e for _, e in self.pending_estimates)]).tolist()
        steps = [first + k for k in range(n)] + [step for step, _ in self.pending_estimates]
        for step, value in sorted(zip(steps, values, strict=True), key=lambda item: item[0]):
            check_finite(self.spec, step, value)
        self.losses.extend(values[:n])
        self.estimates.extend(values[n:])
        self.pending, self.pending_estimates = [], []


def initial_loss(objective: Objective, spec: Mapping[str, Any], gen: torch.Generator) -> float:
    """The loss on batch 0 at initialisation, leaving the weights and buffers (BatchNorm running
    statistics, EMA teachers, centres) exactly as initialised: the record of a zero-step run."""
    state = {name: value.clone() for name, value in objective.state_dict().items()}
    device = objective.pixel_mean.device
    batch = to_batch(
        scene_batch(objective.scenes, spec["scenes"]["seed"], 0, spec["batch_size"]), device
    )
    with torch.no_grad():
        loss = float(objective.loss(batch, gen))
    objective.load_state_dict(state)
    return loss


def check_learning(
    objective: Objective, spec: Mapping[str, Any], losses: list[float], backbone: nn.Module
) -> dict[str, Any]:
    """``meta.json``'s ``learning``: the loss against step 0 and the trivial solution, and a
    per-slot shape probe against the random-initialised backbone (repdiag.encoders.zoo.learning)."""
    # on the objective's device: the trivial loss normalises with its buffers
    batch = to_batch(
        scene_batch(objective.scenes, spec["scenes"]["seed"], 0, spec["batch_size"]),
        objective.pixel_mean.device,
    )
    plateau = plateau_check(losses, objective.trivial_loss(batch))
    fresh, _ = build_objective(spec, "cpu")
    probe = probe_check(
        backbone.cpu(),
        fresh.export()[0],
        objective.scenes,
        spec["scenes"]["seed"],
        objective.mean,
        objective.std,
    )
    return learning_record(plateau, probe)


EVALUATION_BATCHES = 8  # held-out batches the final network's loss terms are measured on
EVALUATION_SEED = 20_011  # their augmentations: one stream, the same for every run


def evaluation_losses(objective: Objective, spec: Mapping[str, Any]) -> dict[str, float] | None:
    """The final network's loss terms (an objective with ``loss_terms``: supervised) on
    :data:`EVALUATION_BATCHES` batches of the scene stream past the last trained step, in eval
    mode and without gradients: the same scenes and augmentations for every run of a schedule, so
    the presence loss of two arms is compared on equal terms and no regulariser enters it. None
    for an objective without terms."""
    if not hasattr(objective, "loss_terms"):
        return None
    gen = torch.Generator().manual_seed(EVALUATION_SEED)
    device = objective.pixel_mean.device
    training = objective.training
    objective.eval()
    sums: dict[str, float] = {}
    try:
        with torch.no_grad():
            for k in range(EVALUATION_BATCHES):
                step = spec["steps"] + k
                scenes = scene_batch(
                    objective.scenes, spec["scenes"]["seed"], step, spec["batch_size"]
                )
                for name, value in objective.loss_terms(to_batch(scenes, device), gen).items():
                    sums[name] = sums.get(name, 0.0) + float(value)
    finally:
        objective.train(training)
    return {name: total / EVALUATION_BATCHES for name, total in sums.items()}


def regulariser_record(
    spec: Mapping[str, Any], estimates: list[float], regulariser: Regulariser
) -> dict[str, Any]:
    """``meta.json["jer_regulariser"]``: the settings, the term's training value at the first step
    it acted and its mean over the last tenth of those steps (null if it never acted), and what it
    did to the weights (:meth:`Regulariser.record`: steps acted, ||P||, realised update share)."""
    tail = estimates[-max(1, len(estimates) // 10) :]
    return {
        **dict(spec["jer_regulariser"]),
        "estimate_first": estimates[0] if estimates else None,
        "estimate_last_mean": float(np.mean(tail)) if estimates else None,
        **regulariser.record(),
    }


def run_steps(
    objective: Objective,
    optimizer: torch.optim.Optimizer,
    spec: Mapping[str, Any],
    gen: torch.Generator,
    record: LossLog,
    prefetch: int = PREFETCH_DEPTH,
    regulariser: Regulariser | None = None,
    snapshots: Snapshots | None = None,
) -> None:
    """The run's optimiser steps, logging progress, their losses into ``record``; batches
    rendered ``prefetch`` steps ahead in a worker thread (0: in the loop), the same bytes; the
    state after each step ``snapshots`` lists copied there."""
    total = steps_trained(spec)
    progress = Progress(total, f"train_zoo {spec['run']} ({spec['objective']})")
    device = objective.pixel_mean.device
    stream = (
        Prefetcher(
            objective.scenes, spec["scenes"]["seed"], spec["batch_size"], total, device, prefetch
        )
        if prefetch > 0 and total > 0
        else None
    )
    try:
        _save(snapshots, objective, 0, record)
        for step in range(total):
            batch = None if stream is None else stream.get(step)
            estimates: list[torch.Tensor] = []
            record.add(
                train_step(objective, optimizer, spec, step, gen, estimates, batch, regulariser),
                estimates,
            )
            progress.update()
            _save(snapshots, objective, step + 1, record)
        record.read()
    finally:
        if stream is not None:
            stream.close()


def _save(snapshots: Snapshots | None, objective: Objective, done: int, record: LossLog) -> None:
    if snapshots is not None and snapshots.due(done):
        record.read()  # the losses so far, on the host (one sync per saved step)
        snapshots.take(objective, done, record.losses, record.estimates)


@dataclass
class Trained:
    """A run's objective after its steps and what finishing it reads."""

    objective: Objective
    kwargs: dict[str, Any]
    spec: Mapping[str, Any]
    device: torch.device | str
    gen: torch.Generator
    losses: list[float]
    estimates: list[float]
    elapsed_s: float


def train(
    spec: Mapping[str, Any], device: torch.device | str, prefetch: int = PREFETCH_DEPTH
) -> TrainResult:
    """Train run ``spec`` (:func:`repdiag.encoders.zoo.spec.run_spec`), logging progress; the
    batches rendered ``prefetch`` steps ahead (0: in the loop; the weights are the same); the
    steps ``spec["save_at"]`` lists finished as their own runs in ``TrainResult.saved``. The
    process keeps its freed heap memory from then on (:func:`keep_freed_memory`)."""
    start = time.monotonic()
    keep_freed_memory()  # the steps' tensors reuse their pages (repdiag.encoders.zoo.allocator)
    objective, kwargs = build_objective(spec, device)
    objective.train()
    optimizer = make_optimizer(objective, spec)
    gen = torch.Generator().manual_seed(spec["seed"])
    record = LossLog(spec)
    settings = RegulariserSettings.of(spec)
    regulariser = Regulariser(spec, objective.backbone) if settings.weight else None
    snapshots = Snapshots(spec, start)
    run_steps(objective, optimizer, spec, gen, record, prefetch, regulariser, snapshots)
    elapsed = time.monotonic() - start
    trained = Trained(
        objective, kwargs, spec, device, gen, record.losses, record.estimates, elapsed
    )
    result = finish(trained, regulariser)
    result.saved = {snap.step: finish_saved(spec, snap, device) for snap in snapshots.taken}
    return result


def finish_saved(
    spec: Mapping[str, Any], snapshot: Snapshot, device: torch.device | str
) -> TrainResult:
    """Step ``snapshot.step`` of run ``spec`` finished as the run with ``stop_at`` at that step
    (:func:`repdiag.encoders.zoo.saved.checkpoint_spec`) finishes: its state loaded into a fresh
    objective, a fresh generator (what the stopped run's would be at step 0; later only its
    losses are read)."""
    child = checkpoint_spec(spec, snapshot.step)
    objective, kwargs = build_objective(child, device)
    objective.load_state_dict(snapshot.state)
    objective.train()
    gen = torch.Generator().manual_seed(child["seed"])
    trained = Trained(objective, kwargs, child, device, gen, list(snapshot.losses),
                      list(snapshot.estimates), snapshot.elapsed_s)  # fmt: skip
    return finish(trained)


def finish(trained: Trained, regulariser: Regulariser | None = None) -> TrainResult:
    """The encoder, meta.json and curve of a trained run: held-out losses, the learning check,
    the run's record."""
    objective, spec, losses = trained.objective, trained.spec, trained.losses
    held_out = evaluation_losses(objective, spec)
    if not losses:  # zero steps: the random-initialised network, a control
        losses.append(initial_loss(objective, spec, trained.gen))
    backbone, head = objective.export()
    backbone.to(memory_format=torch.contiguous_format)  # safetensors saves contiguous tensors
    backbone.eval()
    if head is not None:
        head.eval()
    learning = check_learning(objective, spec, losses, backbone)
    preprocess = {
        "input_size": spec["image_size"],
        "mean": objective.mean,
        "std": objective.std,
        "interpolation": "bilinear",
    }
    meta = run_meta(
        spec, trained.kwargs, preprocess, backbone, head, losses, trained.elapsed_s, trained.device
    )
    meta["learning"] = learning
    if held_out is not None:
        meta["evaluation_losses"] = held_out
    if objective.scenes.arrangement_groups > 1:
        meta["arrangement_groups"] = objective.scenes.arrangement_groups
    if regulariser is not None:
        meta["jer_regulariser"] = regulariser_record(spec, trained.estimates, regulariser)
    log.info(
        "zoo run %s: %s (loss %.4g -> %.4g, trivial %.4g; slot probe %.3f vs %.3f at random init)",
        spec["run"],
        "learned" if learning["learned"] else "NOT learned",
        learning["initial_loss"],
        learning["final_loss_mean"],
        learning["trivial_loss"],
        learning["slot_probe_accuracy"],
        learning["slot_probe_accuracy_random_init"],
    )
    log.info(
        "zoo run %s: loss %.4f -> %.4f in %.0f s", spec["run"], losses[0], losses[-1],
        meta["wall_time_s"],
    )  # fmt: skip
    push = None if regulariser is None else regulariser.cumulative_push()
    return TrainResult(backbone.cpu(), None if head is None else head.cpu(), meta, losses, push)

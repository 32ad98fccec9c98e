"""The intervention's strength, calibrated on the optimizer's update: the push's share of the
AdamW step, measured along the plain run (a short recorded pilot).

A weight ``w`` is a different strength for each objective, base and term, and a raw gradient norm
says little about it: AdamW divides each coordinate by the root of its own second moment, so a
push whose gradient is 0.2x the objective's can be a larger or a smaller share of the step. A
term's strength is therefore stated as

    share_t = ||q_t|| / ||u_t||,   q_t = lr_t c_t w g_term / (sqrt(v_hat_t) + eps),
                                   u_t = the AdamW step of the (clipped) objective gradient alone,

at step t of the plain run, over the backbone's trainable weights
(:func:`repdiag.encoders.zoo.regulariser.update_share`; ``c_t`` the clip coefficient, ``v_hat_t``
the bias-corrected second moment the plain step leaves). q_t is the push's contribution to the
step at steady state (a push held constant reaches AdamW's first moment at its full size). The
pilot trains the plain run (no term, so the trajectory is the plain run's bit for bit) and, every
``every`` steps, takes the objective's and each term's gradient from a snapshot it restores
(weights, buffers and the augmentation generator), so measuring changes nothing. Per term, the
weight that puts the median share at ``target`` is ``target / median_t(share_t / |w|)``.

``repdiag calibrate RUN [RUN ...]`` prints and writes the shares for the
zoo runs of a config; rule ``causal_calibration`` records it for each causal base.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from repdiag.core.settings import FromConfig
from repdiag.encoders.zoo.regulariser import (
    RegulariserSettings,
    clip_coefficient,
    probe_generator,
    term_value,
    update_share,
)
from repdiag.encoders.zoo.scenes import scene_batch
from repdiag.encoders.zoo.train import (
    build_objective,
    check_finite,
    learning_rate,
    make_optimizer,
    steps_trained,
    to_batch,
    train_step,
)

TERMS_MEASURED = ("jer", "global_pr")
"""The terms whose share the pilot measures (the direction sham is sized by the jer term's
gradient per tensor, so its weight is the raise arm's)."""


@dataclass(frozen=True)
class PilotSettings(FromConfig):
    """``every``: measure at steps 0, every, 2 every, ... and the last; ``target``: the ratio the
    suggested weight aims at (the middle of :data:`TARGET_RANGE`)."""

    SECTION = "binding_causal.calibration"

    every: int
    target: float

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be >= 1 (got {self.every})")
        if not self.target > 0:
            raise ValueError(f"target must be > 0 (got {self.target})")


def backbone_parameters(objective: Any) -> list[torch.nn.Parameter]:
    """The backbone's trainable weights: where the shares are measured."""
    return [p for p in objective.backbone.parameters() if p.requires_grad]


def step_shares(
    objective: Any,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    spec: Mapping[str, Any],
    step: int,
    gen: torch.Generator,
    regulariser: RegulariserSettings,
) -> dict[str, float]:
    """Per term of :data:`TERMS_MEASURED`, the share of the AdamW step a unit-weight push would
    take at the current weights and optimizer state (:func:`update_share`, the learning rate of
    ``step``; the PR2 estimate on ``regulariser``'s images and probes), leaving weights, buffers,
    optimizer and ``gen`` as they were."""
    state = {name: value.clone() for name, value in objective.state_dict().items()}
    gen_state = gen.get_state()
    trainable = [p for _, p in objective.trainable_parameters()]
    params = backbone_parameters(objective)
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, spec["steps"], spec["lr"], spec["warmup_fraction"])
    try:
        loss = objective.loss(batch, gen)
        all_grads = torch.autograd.grad(loss, trainable, allow_unused=True)
        index = {id(p): k for k, p in enumerate(trainable)}
        objective_grads = [all_grads[index[id(p)]] for p in params]
        clip = clip_coefficient(all_grads, spec["grad_clip"])
        shares = {}
        for term in TERMS_MEASURED:
            settings = replace(regulariser, term=term, weight=1.0)
            value = term_value(objective, batch, settings, probe_generator(spec["seed"], step))
            term_grads = torch.autograd.grad(value, params, allow_unused=True)
            push = [None if g is None else -g for g in term_grads]
            # clipped with the coefficient of the whole (all-parameter) gradient, as the step is
            shares[term] = update_share(optimizer, params, objective_grads, push, clip)
    finally:
        objective.load_state_dict(state)
        gen.set_state(gen_state)
    return shares


def measured_steps(total: int, every: int) -> list[int]:
    """0, every, 2 every, ... below ``total``, and the last step."""
    return sorted({*range(0, total, every), total - 1}) if total > 0 else []


def pilot(spec: Mapping[str, Any], settings: PilotSettings) -> pd.DataFrame:
    """One row per measured step of the plain run of ``spec`` and term (module docstring):
    ``run``, ``step``, ``term``, ``share_per_unit_weight``."""
    measured_with = RegulariserSettings.of(spec)  # its images and probes
    plain = {**spec, "jer_regulariser": {}}
    objective, _ = build_objective(plain, "cpu")
    objective.train()
    optimizer = make_optimizer(objective, plain)
    gen = torch.Generator().manual_seed(plain["seed"])
    device = objective.pixel_mean.device
    total = steps_trained(plain)
    measured = set(measured_steps(total, settings.every))
    rows = []
    for step in range(total):
        if step in measured:
            scenes = scene_batch(
                objective.scenes, plain["scenes"]["seed"], step, plain["batch_size"]
            )
            shares = step_shares(
                objective, optimizer, to_batch(scenes, device), plain, step, gen, measured_with
            )
            rows.extend(
                {"run": spec["run"], "step": step, "term": term, "share_per_unit_weight": share}
                for term, share in shares.items()
            )
        check_finite(plain, step, float(train_step(objective, optimizer, plain, step, gen)))
    return pd.DataFrame(rows)


def calibration_summary(rows: pd.DataFrame, settings: PilotSettings) -> pd.DataFrame:
    """Per run and term: the share per unit weight (median, 10th and 90th percentile over the
    measured steps) and the weight whose median share is ``settings.target``."""
    out = []
    for (run, term), part in rows.groupby(["run", "term"], sort=False):
        per_unit = part["share_per_unit_weight"].to_numpy(float)
        median = float(np.nanmedian(per_unit))
        out.append(
            {
                "run": run,
                "term": term,
                "n_steps": len(part),
                "share_per_unit_weight_median": median,
                "share_per_unit_weight_p10": float(np.nanpercentile(per_unit, 10)),
                "share_per_unit_weight_p90": float(np.nanpercentile(per_unit, 90)),
                "target": settings.target,
                "weight_for_target": settings.target / median if median > 0 else math.nan,
            }
        )
    return pd.DataFrame(out)


def main(argv: Sequence[str] | None = None) -> None:
    """``repdiag calibrate [--config config/config.yaml] RUN [RUN ...]`` (:data:`repdiag.studies.COMMANDS`)."""
    from repdiag.core.config import load_config
    from repdiag.encoders.zoo.spec import run_spec

    parser = argparse.ArgumentParser(
        prog="repdiag calibrate",
        description="Share of the AdamW step a unit-weight push of each term would take, on the "
        "backbone, along each run's plain trajectory (docs/binding.md, the causal test).",
    )
    parser.add_argument("runs", nargs="+", help="zoo runs (zoo.objectives keys or series cells)")
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--every", type=int, default=None, help="default: the schema's")
    parser.add_argument("--target", type=float, default=None, help="default: the schema's")
    parser.add_argument("--steps", type=int, default=None, help="measure the first N steps only")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="CSV of every measured step")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    chosen = {"every": args.every, "target": args.target}
    settings = PilotSettings.from_config({k: v for k, v in chosen.items() if v is not None})
    frames = []
    for run in args.runs:
        spec = run_spec(config, run)
        if args.steps is not None:
            spec["stop_at"] = min(args.steps, spec["steps"])
        frames.append(pilot(spec, settings))
    rows = pd.concat(frames, ignore_index=True)
    if args.out:
        rows.to_csv(args.out, index=False)
    print(calibration_summary(rows, settings).to_string(index=False))

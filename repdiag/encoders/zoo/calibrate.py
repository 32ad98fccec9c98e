"""The JER regulariser's strength, calibrated: its gradient norm on the backbone against the
objective's, measured along the plain run (a short recorded pilot).

A weight ``w`` is a different strength for each objective and base (at ``|w| = 0.05`` the term's
gradient was 10-18x the presence-and-slot objective's, at ``|w| = 0.01`` SimCLR's only
0.15-0.2x), so a causal arm states its strength as the ratio

    rho_t = |w| * ||d PR2_hat / d theta_backbone|| / ||d L_objective / d theta_backbone||

at step t of the plain run (theta: the backbone's trainable weights; the heads are not the
backbone; both gradients before clipping, each on that step's batch, the estimate on the probes
of that step). The pilot trains the plain run (the regulariser off, so the trajectory is the
plain run's bit for bit) and measures both norms every ``every`` steps from a snapshot it then
restores (weights, buffers and the augmentation generator), so measuring changes nothing. The
weight that puts the median ratio at ``target`` is ``target / median_t(rho_t / |w|)``.

``python -m repdiag.encoders.zoo.calibrate RUN [RUN ...]`` prints and writes the ratios for the
zoo runs of a config (each run's own ``jer_regulariser`` gives |w|, the images and the probes);
rule ``causal_calibration`` records it for the bases of ``binding_causal``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from repdiag.core.settings import FromConfig
from repdiag.encoders.zoo.scenes import scene_batch
from repdiag.encoders.zoo.train import (
    build_objective,
    check_finite,
    jer_penalty,
    make_optimizer,
    probe_generator,
    steps_trained,
    to_batch,
    train_step,
)

TARGET_RANGE = (0.1, 0.3)
"""The ratio a calibrated regulariser's gradient norm keeps to the objective's."""


@dataclass(frozen=True)
class PilotSettings(FromConfig):
    """``every``: measure at steps 0, every, 2 every, ... and the last; ``target``: the ratio the
    suggested weight aims at (the middle of :data:`TARGET_RANGE`)."""

    SECTION = "binding_causal.calibration"

    every: int = 25
    target: float = 0.2

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be >= 1 (got {self.every})")
        if not self.target > 0:
            raise ValueError(f"target must be > 0 (got {self.target})")


def backbone_parameters(objective: Any) -> list[torch.nn.Parameter]:
    """The backbone's trainable weights: where both gradients are compared."""
    return [p for p in objective.backbone.parameters() if p.requires_grad]


def global_norm(grads: Sequence[torch.Tensor | None]) -> float:
    """sqrt(sum of squares) over every entry of every gradient (None: no path, counts 0)."""
    squares = [g.detach().double().square().sum() for g in grads if g is not None]
    return float(torch.stack(squares).sum().sqrt()) if squares else 0.0


def gradient_norms(
    objective: Any,
    batch: Any,
    regulariser: Mapping[str, Any],
    probes: torch.Generator,
    gen: torch.Generator,
) -> tuple[float, float]:
    """(||grad L_objective||, ||grad PR2_hat||) on the backbone at the current weights, leaving
    the weights, buffers and ``gen`` as they were."""
    state = {name: value.clone() for name, value in objective.state_dict().items()}
    gen_state = gen.get_state()
    params = backbone_parameters(objective)
    try:
        loss = objective.loss(batch, gen)
        objective_grads = torch.autograd.grad(loss, params, allow_unused=True)
        estimate = jer_penalty(objective, batch, regulariser, probes)
        jer_grads = torch.autograd.grad(estimate, params, allow_unused=True)
    finally:
        objective.load_state_dict(state)
        gen.set_state(gen_state)
    return global_norm(objective_grads), global_norm(jer_grads)


def measured_steps(total: int, every: int) -> list[int]:
    """0, every, 2 every, ... below ``total``, and the last step."""
    return sorted({*range(0, total, every), total - 1}) if total > 0 else []


def pilot(spec: Mapping[str, Any], settings: PilotSettings) -> pd.DataFrame:
    """One row per measured step of the plain run of ``spec`` (module docstring): ``step``,
    ``objective_grad_norm``, ``jer_grad_norm`` (per unit weight), ``ratio_per_unit_weight``,
    ``weight`` (|w| of ``spec``'s regulariser) and ``ratio`` (at that weight)."""
    regulariser = dict(spec.get("jer_regulariser") or {})
    weight = abs(float(regulariser.get("weight") or 0.0))
    plain = {**spec, "jer_regulariser": {}}
    objective, _ = build_objective(plain)
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
            obj_norm, jer_norm = gradient_norms(
                objective, to_batch(scenes, device), regulariser, probe_generator(plain, step), gen
            )
            per_unit = jer_norm / obj_norm if obj_norm > 0 else math.nan
            rows.append(
                {
                    "run": spec["run"],
                    "step": step,
                    "objective_grad_norm": obj_norm,
                    "jer_grad_norm": jer_norm,
                    "ratio_per_unit_weight": per_unit,
                    "weight": weight,
                    "ratio": weight * per_unit,
                }
            )
        check_finite(plain, step, float(train_step(objective, optimizer, plain, step, gen)))
    return pd.DataFrame(rows)


def calibration_summary(rows: pd.DataFrame, settings: PilotSettings) -> pd.DataFrame:
    """Per run: the weight's ratio (median, min, max over the measured steps), the share of steps
    inside :data:`TARGET_RANGE`, and the weight whose median ratio is ``settings.target``."""
    low, high = TARGET_RANGE
    out = []
    for run, part in rows.groupby("run", sort=False):
        ratio = part["ratio"].to_numpy(float)
        per_unit = float(np.nanmedian(part["ratio_per_unit_weight"]))
        out.append(
            {
                "run": run,
                "n_steps": len(part),
                "weight": float(part["weight"].iloc[0]),
                "ratio_median": float(np.nanmedian(ratio)),
                "ratio_min": float(np.nanmin(ratio)),
                "ratio_max": float(np.nanmax(ratio)),
                "share_in_range": float(np.mean((ratio >= low) & (ratio <= high))),
                "weight_for_target": settings.target / per_unit if per_unit > 0 else math.nan,
                "target": settings.target,
            }
        )
    return pd.DataFrame(out)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m repdiag.encoders.zoo.calibrate [--config config/config.yaml] RUN [RUN ...]``."""
    from repdiag.core.config import load_config
    from repdiag.encoders.zoo.spec import run_spec

    parser = argparse.ArgumentParser(
        prog="python -m repdiag.encoders.zoo.calibrate",
        description="Gradient-norm ratio of the JER regulariser to the objective, on the backbone, "
        "along each run's plain trajectory (docs/binding.md, the causal test).",
    )
    parser.add_argument("runs", nargs="+", help="zoo runs (zoo.objectives keys or series cells)")
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--every", type=int, default=PilotSettings.every)
    parser.add_argument("--target", type=float, default=PilotSettings.target)
    parser.add_argument("--steps", type=int, default=None, help="measure the first N steps only")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="CSV of every measured step")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    settings = PilotSettings(every=args.every, target=args.target)
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


if __name__ == "__main__":
    main()

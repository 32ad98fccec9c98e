"""Steps saved inside one training run (a run's ``save_at``).

At each listed step ``t`` (``t`` optimiser steps done; 0 = the initialisation) the training loop
copies the objective's whole state (backbone, head, teachers, buffers) to the CPU with the losses
so far (:class:`Snapshots`). After the run, each copy is finished as a run of
:func:`checkpoint_spec` (the run's settings with ``stop_at: t``, named ``<run>-step<t>``) would be
(:func:`repdiag.encoders.zoo.train.finish_saved`): the same weights, losses, learning check and
held-out losses as retraining the first ``t`` steps, without the retraining. The workflow declares
those runs (:func:`repdiag.core.series.expand_saved`) and writes each out of the run's
``saved.safetensors`` (rule ``zoo_checkpoint``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from repdiag.core.series import checkpoint_name


@dataclass(frozen=True)
class Snapshot:
    """The objective's state after ``step`` steps, on the CPU, and what the run had recorded."""

    step: int
    state: dict[str, torch.Tensor]
    losses: list[float]
    estimates: list[float]
    elapsed_s: float


class Snapshots:
    """The snapshots of the steps ``spec["save_at"]`` lists, taken by the training loop."""

    def __init__(self, spec: Mapping[str, Any], start: float) -> None:
        self.steps = frozenset(int(step) for step in spec.get("save_at") or ())
        self.start = start
        self.taken: list[Snapshot] = []

    def due(self, done: int) -> bool:
        """Whether the state after ``done`` steps is saved."""
        return done in self.steps

    def take(
        self, objective: nn.Module, done: int, losses: list[float], estimates: list[float]
    ) -> None:
        """Copy ``objective``'s state after ``done`` steps (the losses read to the host first)."""
        state = {
            name: value.detach().to("cpu", copy=True)
            for name, value in objective.state_dict().items()
        }
        elapsed = time.monotonic() - self.start
        self.taken.append(Snapshot(done, state, list(losses), list(estimates), elapsed))


def checkpoint_spec(spec: Mapping[str, Any], step: int) -> dict[str, Any]:
    """The spec of step ``step`` of run ``spec``: the run :func:`repdiag.encoders.zoo.spec.run_spec`
    gives for ``<run>-step<step>`` (its settings, ``stop_at: step``, no ``save_at``)."""
    child = {key: value for key, value in spec.items() if key != "save_at"}
    return child | {"run": checkpoint_name(spec["run"], step), "stop_at": int(step)}

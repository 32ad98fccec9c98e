"""Cost planner of the Jacobian stage: the work, memory per pass and projected time of a config's
Jacobian spectra, offline and without weights (``repdiag plan <config>``, :mod:`.plan_print`).

Every model of the config is built with random weights on the meta device (no data, no memory;
:func:`repdiag.encoders.factory.build_encoder` with ``meta=True``) and counted by
:func:`.plan_costs.plan_model` (the formulas are there); the time is the total (linalg
included) over a FLOP rate: by default the float32 matmul rate measured here, a lower bound,
since real kernels reach a fraction of peak.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from repdiag.encoders.factory import build_encoder, offline
from repdiag.encoders.jacobian.engine import DEFAULT_BATCH_SIZE
from repdiag.encoders.jacobian.options import JacobianSettings
from repdiag.encoders.jacobian.plan_costs import ModelPlan, NotPlanned, plan_model


@dataclasses.dataclass
class Plan:
    """Every planned model, the ones left out (``{key: why}``) and the settings used."""

    models: list[ModelPlan]
    skipped: dict[str, str]
    settings: dict[str, Any]
    rate: float
    rate_source: str

    @property
    def total_flops(self) -> float:
        return sum(model.total_flops for model in self.models)

    @property
    def seconds(self) -> float:
        return self.total_flops / self.rate


def measure_rate(size: int = 2048, repeats: int = 3, device: str | None = None) -> float:
    """float32 matmul FLOP/s here: best of ``repeats`` ``size`` x ``size`` products (2 n^3 each)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    best = math.inf
    for _ in range(repeats + 1):  # the first is a warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


def plan_config(
    config: Mapping[str, Any],
    *,
    rate: float | None = None,
    device: str = "cpu",
    models: Sequence[str] | None = None,
) -> Plan:
    """The cost plan of every model (or ``models``) of a loaded config (defaults filled).

    ``device`` chooses the default ``batch_size`` when the config leaves it null
    (:data:`~.engine.DEFAULT_BATCH_SIZE`). ``rate`` in FLOP/s; default: :func:`measure_rate` on
    this machine. A model that cannot be built or counted is left out (``Plan.skipped``).
    """
    settings = plan_settings(config["jacobians"], device)
    planned, skipped, seen = [], {}, {}
    entries = config.get("models") or {}
    for key in models or list(entries):
        try:
            plan = _plan_entry(key, entries[key], config, settings, seen)
            planned.append(plan)
        except Exception as err:  # any model that cannot be built or counted is left out
            skipped[key] = f"{type(err).__name__}: {err}".splitlines()[0][:200]
    if rate is None:
        rate, source = measure_rate(), f"measured here (float32 matmul, {_device_name()})"
    else:
        source = "given"
    return Plan(planned, skipped, settings, float(rate), source)


def plan_settings(section: Mapping[str, Any], device: str) -> dict[str, Any]:
    """The settings a plan is made for, from the ``jacobians`` section, for ``device``."""
    jacobians = JacobianSettings.from_config(section)
    return {
        "method": jacobians.method,
        "k": jacobians.k,
        "power_iters": jacobians.power_iters,
        "batch_size": jacobians.batch_size or DEFAULT_BATCH_SIZE[device],
        "chunk_size": jacobians.chunk_size,
        "layers": list(jacobians.layers),
        "images": sum(jacobians.probe_counts().values()),
        "device": device,
        # FLOPs do not depend on it; the rate does (--rate: the device's peak at this precision)
        "precision": jacobians.precision,
    }


def _plan_entry(
    key: str,
    entry: Mapping[str, Any],
    config: Mapping[str, Any],
    settings: Mapping[str, Any],
    seen: dict[tuple, ModelPlan],
) -> ModelPlan:
    """The plan of ``models.<key>``, built on the meta device; a model of an architecture in
    ``seen`` (e.g. two seeds) costs the same and is not counted again."""
    engine = {
        name: settings[name] for name in ("method", "k", "power_iters", "batch_size", "chunk_size")
    }
    engine.update(images=settings["images"], layers=settings["layers"] or None, key=key)
    default_pooling = config["embeddings"]["pooling"]
    encoder = build_encoder(key, entry, default_pooling=default_pooling, meta=True, config=config)
    how = encoder.origin
    shape = (3, int(encoder.preprocess.input_size), int(encoder.preprocess.input_size))
    signature = (str(encoder.model), encoder.pooling, shape)
    if signature in seen:
        return dataclasses.replace(seen[signature], key=key, kind=how)
    try:
        plan = plan_model(encoder, shape, kind=how, **engine)
    except Exception as err:
        if entry.get("source") != "python":
            raise
        check_runs_off_cpu(key, err, settings["device"])
        # a control whose forward needs data (not shapes alone): counted on one real image
        with offline():
            encoder = build_encoder(key, entry)
        plan = plan_model(encoder, shape, kind=f"{how} (counted on CPU)", **engine)
    seen[signature] = plan
    return plan


# What torch says when an op mixes devices (CUDA and meta word it differently) or a random op is
# given a generator of another device.
DEVICE_MISMATCH = re.compile(
    r"same device|not on the expected device|device type for generator|found two devices"
)


def check_runs_off_cpu(key: str, err: Exception, device: str) -> None:
    """Raise :class:`NotPlanned` when ``models.<key>`` failed on the meta device because its
    forward mixes devices: it would fail on ``device`` too (a tensor made without the input's
    device lands on the CPU), so counting it on the CPU would hide the failure. A CPU target runs it
    as counted."""
    if device != "cpu" and DEVICE_MISMATCH.search(str(err)):
        first = str(err).splitlines()[0][:80]
        raise NotPlanned(
            f"cannot run on {device}, a tensor stays on the CPU ({first}); "
            f"make it on the input's device in models.{key}'s forward"
        ) from err


def _device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"

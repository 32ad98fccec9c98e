"""The work and memory of one model's Jacobian spectra (:func:`plan_model`), counted on a module
as built (the meta device: shapes, no data, no memory) and read by both the config's planner
(:mod:`.plan_project`, ``repdiag plan``) and the GPU job's pass sizing (:mod:`.pass_size`); it
builds no encoder itself. The unit costs of one probe image are counted by :mod:`.plan_count`. The units are combined with the engine's
algorithm (:mod:`.engine`: methods per tap by :func:`~.engine.layer_methods`, chains by
:meth:`~.engine.Readout.chains`), per image, with k directions, q power iterations, n images per
pass and c = ceil(k / chunk) vmap calls of ``chunk = max(1, batch // n)`` directions:

* exact tap l (a root): ``d_l`` VJPs, ``fwd_l + d_l vjp_l`` FLOPs;
* tap t derived from an exact tap p (chain rule, no product through the network): the counted
  row Jacobian of its small function plus ``2 d_t d_p w`` for ``local @ rows_p``, where
  ``w = d_root`` when the root's rows are carried in their R factor (``d_in > 2 d_root``), else
  ``d_in``;
* the shared sketch J Omega of the randomized taps R: k JVPs, ``c call_R + k jvp_R``;
* randomized tap l: ``q k`` JVPs and ``(q + 1) k`` VJPs,
  ``fwd_l + q (c call_l + k jvp_l) + (q + 1) k vjp_l``; with the sketch, k (2q + 2) products,
  the figure ``auto`` compares with d_l;
* ``(d_out)``: the engine's forward of every tap on one image per engine call (as many whole
  chunks as one pass of ``batch_size`` products holds, at most the images planned).

QR and SVD FLOPs are given apart (``linalg``). Memory per pass (an estimate):
``P + n A_l + p G_l + rows``, with P the parameters and buffers, A_l and G_l as counted
(:class:`~.plan_count.LiveBytes`), p = min(chunk, directions) n products in flight and rows the
Jacobian rows (exact: ``n d_l d_in``) or directions (randomized: ``n k (d_in + d_l)``) kept, in the
model's dtype, times :data:`MEMORY_CALIBRATION` (what the count misses: the allocator's rounding,
temporaries of vmap and autograd, cuBLAS workspaces). The time is the total (linalg included) over a FLOP rate: by default the float32
matmul rate measured here; a lower bound, since real kernels reach a fraction of peak.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from repdiag.core.errors import RepdiagError
from repdiag.encoders.jacobian.engine import Readout, layer_methods, row_jacobians
from repdiag.encoders.jacobian.options import chunks_per_call
from repdiag.encoders.jacobian.plan_count import (
    TapUnits,
    count_flops,
    qr_flops,
    spectrum_flops,
)
from repdiag.encoders.jacobian.rewrites import jacobian_mode

MEMORY_CALIBRATION = 1.8
"""Factor on the counted memory of a pass beyond the parameters, from the peaks measured on an
H200 (``benchmarks/measured/gpu-h200.json``, ``throughput``: ViT-B/16 over every tap, 224 px,
k = 32, q = 5, exact at 256-2048 products per pass and randomized/auto in fp32, tf32 and bf16;
``torch.cuda.max_memory_allocated`` of one engine call). Uncalibrated, the estimate came to
0.63-0.87 of those peaks (its part beyond the parameters to 0.57-0.86 of theirs: randomized
0.57, exact 0.72 at 2048 products to 0.86 at 256); 1.8 >= 1/0.57 puts every row at 1.03-1.47 of
its peak (``tests/encoders/jacobian/test_plan_costs.py`` reads the file and checks >= 0.9 on
each). One card and one architecture: the first pass of a GPU job measures its own peak and
sizes the rest from it (:mod:`.cache`, :func:`.pass_size.measured_batch_size`)."""


class NotPlanned(RepdiagError):
    """A model the planner cannot count; the message says why."""


# ----------------------------------------------------------------------------------------------
# Plan records
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TapCost:
    """Per probe image: products through the network, counted and linear-algebra FLOPs; memory
    of one pass in bytes. ``method``: exact, randomized, chain (exact, derived from ``parent``)
    or sketch (the shared J Omega of the randomized taps)."""

    name: str
    method: str
    d_out: int
    jvps: int
    vjps: int
    flops: float
    linalg_flops: float
    memory_bytes: float
    parent: str | None = None

    @property
    def products(self) -> int:
        return self.jvps + self.vjps


@dataclasses.dataclass
class ModelPlan:
    """One model: its taps' costs per image and the number of probe images."""

    key: str
    kind: str
    input_shape: tuple[int, ...]
    taps: list[TapCost]
    images: int
    param_bytes: int

    @property
    def flops_per_image(self) -> float:
        return sum(tap.flops for tap in self.taps)

    @property
    def linalg_per_image(self) -> float:
        return sum(tap.linalg_flops for tap in self.taps)

    @property
    def products_per_image(self) -> int:
        return sum(tap.products for tap in self.taps)

    @property
    def peak_memory_bytes(self) -> float:
        return max((tap.memory_bytes for tap in self.taps), default=0.0)

    @property
    def total_flops(self) -> float:
        return (self.flops_per_image + self.linalg_per_image) * self.images


# ----------------------------------------------------------------------------------------------
# The plan of one model
# ----------------------------------------------------------------------------------------------


def _module_bytes(module: nn.Module | None) -> tuple[int, int]:
    """(bytes of parameters and buffers, element size of the first floating one)."""
    if module is None:
        return 0, 4
    tensors = [*module.parameters(), *module.buffers()]
    size = sum(t.numel() * t.element_size() for t in tensors)
    floating = [t for t in tensors if t.is_floating_point()]
    return int(size), floating[0].element_size() if floating else 4


def plan_model(
    model: Any,
    input_shape: Sequence[int],
    *,
    method: str,
    k: int,
    power_iters: int,
    batch_size: int,
    chunk_size: int,
    images: int = 1,
    layers: Sequence[str] | None = None,
    key: str = "model",
    kind: str = "",
) -> ModelPlan:
    """Per-image Jacobian work of ``model`` (an encoder with taps or a module, ideally on meta)
    at inputs of ``input_shape`` (C, H, W), for the engine's settings (module docstring)."""
    readout = Readout(model)
    layers = readout.check(layers)
    module = readout.module
    param_bytes, itemsize = _module_bytes(module)
    tensors = [*module.parameters(), *module.buffers()] if module is not None else []
    device = tensors[0].device if tensors else torch.device("cpu")  # no tensors: any device
    floating = [t.dtype for t in tensors if t.is_floating_point()]
    # the probe in the model's own dtype: a float64 (or half) model refuses a float32 input
    x = torch.zeros((1, *input_shape), device=device, dtype=floating[0] if floating else None)
    d_in = math.prod(input_shape)
    # images per engine call: as many whole chunks as one pass of batch_size products holds
    # (cache.run_chunked; a pass is not capped at chunk_size images), at most the images there are
    call_images = min(chunks_per_call(batch_size, k, chunk_size) * chunk_size, max(1, images))
    common = {
        "d_in": d_in,
        "itemsize": itemsize,
        "param_bytes": param_bytes,
        "batch_size": batch_size,
        "chunk_size": call_images,
    }
    # under the engine's rewrites, as the engine runs: the tangent rules of linear and layer norm
    # (.tangent_rules) skip the parameters' zero tangents that torch's own rules multiply
    with jacobian_mode(module, rewrites=True):
        with torch.no_grad():
            outputs = readout(x, layers)
        d_out = {name: int(outputs[name].reshape(1, -1).shape[1]) for name in layers}
        del outputs
        methods = layer_methods(readout, layers, method, d_out, k, power_iters)
        exact = [name for name in layers if methods[name] == "exact"]
        randomized = [name for name in layers if methods[name] == "randomized"]
        chains = readout.chains(exact)
        followers = {child for children in chains.values() for child in children}
        units = TapUnits(model, readout, x)
        costs: dict[str, TapCost] = {}
        for name in exact:
            if name not in followers:
                costs.update(
                    _exact_costs(readout, units, name, chains.get(name, []), x, d_out, **common)
                )
        taps = [costs[name] for name in layers if name in costs]
        if randomized:
            taps += _randomized_costs(units, randomized, d_out, k, power_iters, **common)
        # jacobian_spectra's one forward of every tap on one image (d_out), per engine call
        setup = units(tuple(layers)).fwd / call_images
        taps.append(TapCost("(d_out)", "setup", 0, 0, 0, setup, 0.0, float(param_bytes)))
    order = {name: i for i, name in enumerate(["(d_out)", "(sketch)", *layers])}
    taps.sort(key=lambda tap: order.get(tap.name, len(order)))
    return ModelPlan(
        key, kind or type(model).__name__, tuple(input_shape), taps, images, param_bytes
    )


def _exact_costs(
    readout: Readout,
    units: TapUnits,
    root: str,
    chain: Sequence[str],
    x: torch.Tensor,
    d_out: Mapping[str, int],
    *,
    d_in: int,
    itemsize: int,
    param_bytes: int,
    batch_size: int,
    chunk_size: int,
) -> dict[str, TapCost]:
    """``root``: d VJPs; each tap of ``chain``: its row Jacobian and ``local @ rows_parent``."""
    d = d_out[root]
    unit = units((root,))
    n = min(max(1, batch_size // max(d_out[t] for t in (root, *chain))), chunk_size)
    in_flight = min(max(1, batch_size // n), d) * n
    counted = n * unit.saved + in_flight * unit.peak + n * d * d_in * itemsize
    memory = param_bytes + MEMORY_CALIBRATION * counted
    costs = {
        root: TapCost(
            root, "exact", d, 0, d, unit.fwd + d * unit.vjp, spectrum_flops(d, d_in), float(memory)
        )
    }
    width = d if d_in > 2 * d else d_in  # the root's rows, carried in their R factor when wide
    values = {root: torch.zeros((1, d), device=x.device)}
    for name in chain:
        parent, fn = readout.derived[name]
        with torch.no_grad():
            values[name] = fn(values[parent]).reshape(1, -1)
        local = count_flops(lambda fn=fn, parent=parent: row_jacobians(fn, values[parent]))
        d_c, d_p = d_out[name], d_out[parent]
        flops = local + 2.0 * d_c * d_p * width
        costs[name] = TapCost(
            name,
            "chain",
            d_c,
            0,
            0,
            float(flops),
            spectrum_flops(d_c, width),
            float(memory),
            parent=parent,
        )
    return costs


def _randomized_costs(
    units: TapUnits,
    layers: Sequence[str],
    d_out: Mapping[str, int],
    k: int,
    power_iters: int,
    *,
    d_in: int,
    itemsize: int,
    param_bytes: int,
    batch_size: int,
    chunk_size: int,
) -> list[TapCost]:
    """The shared sketch (k JVPs of every randomized tap) and each tap's subspace iteration."""
    n = min(max(1, batch_size // k), chunk_size)
    chunk = max(1, batch_size // n)
    chunks = math.ceil(k / chunk)
    in_flight = min(chunk, k) * n
    q = power_iters
    taps, sketch_peak = [], 0.0
    for name in layers:
        d = d_out[name]
        unit = units((name,))
        if q and math.isnan(unit.jvp):
            raise NotPlanned(f"tap {name} is randomized but has an op without forward-mode AD")
        flops = unit.fwd + q * (chunks * unit.jvp_call + k * unit.jvp) + (q + 1) * k * unit.vjp
        linalg = (
            qr_flops(d, k)  # orth of the sketch
            + q * (qr_flops(d_in, k) + qr_flops(d, k))  # orth(J^T Q), orth(J Z)
            + spectrum_flops(k, d_in)  # the top k of B = Q^T J
        )
        counted = n * unit.saved + in_flight * unit.peak + n * k * (d_in + d) * itemsize
        memory = param_bytes + MEMORY_CALIBRATION * counted
        sketch_peak = max(sketch_peak, unit.peak)
        taps.append(
            TapCost(name, "randomized", d, q * k, (q + 1) * k, flops, linalg, float(memory))
        )
    together = units(tuple(layers))
    if math.isnan(together.jvp):
        raise NotPlanned(
            f"taps {list(layers)} are randomized but have an op without forward-mode AD"
        )
    directions = n * k * (d_in + sum(d_out[name] for name in layers)) * itemsize
    sketch = TapCost(
        "(sketch)",
        "sketch",
        sum(d_out[name] for name in layers),
        k,
        0,
        chunks * together.jvp_call + k * together.jvp,
        0.0,
        float(param_bytes + MEMORY_CALIBRATION * (in_flight * sketch_peak + directions)),
    )
    return [sketch, *taps]

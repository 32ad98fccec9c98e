"""The pass size of the Jacobian engine on a GPU: the largest ``batch_size`` (Jacobian-vector
products evaluated together) whose memory, as the planner estimates it
(:func:`.plan_costs.plan_model`: ``P + n A_l + p G_l + rows`` per tap, its maximum over taps),
fits in a fraction of the device's free memory.

The estimate grows with the batch (more images and products in flight, more rows or directions
kept), so the largest fitting batch is found by doubling from k and then bisecting
(:func:`fitting_batch_size`), each step one planner estimate. The planner's memory is calibrated
against measured peaks (:data:`.plan_costs.MEMORY_CALIBRATION`); on the GPU the job's first
engine call then measures its own peak per image and the remaining passes are sized from that
(:func:`measured_batch_size`, called by :func:`.cache.run_chunked`), and an out-of-memory error
halves the pass there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from repdiag.encoders.jacobian.engine import Readout
from repdiag.encoders.jacobian.plan_costs import plan_model

FREE_FRACTION = 0.8  # of the free memory: room for the allocator's fragmentation and cuBLAS
MAX_BATCH_SIZE = 1 << 16


def fitting_batch_size(
    estimate: Callable[[int], float], budget_bytes: float, *, k: int, cap: int = MAX_BATCH_SIZE
) -> int:
    """Largest multiple of ``k`` up to ``cap`` with ``estimate(batch) <= budget_bytes`` (``k``
    when even that does not fit), for an ``estimate`` that grows with the batch: doubling from
    ``k``, then bisection to a step of ``k`` or an eighth of the fitting batch."""
    low = k
    if estimate(low) > budget_bytes:
        return k
    high = None
    while low * 2 <= cap:
        if estimate(low * 2) > budget_bytes:
            high = low * 2
            break
        low *= 2
    if high is None:
        return low
    while high - low > max(k, low // 8):
        middle = (low + high) // 2 // k * k
        if middle <= low:
            break
        if estimate(middle) <= budget_bytes:
            low = middle
        else:
            high = middle
    return low


def planned_pass_bytes(
    model: Any, input_shape: tuple[int, ...], engine: Mapping[str, Any], batch_size: int
) -> float:
    """The planner's peak memory of one pass of ``batch_size`` products (no chunk cap on the
    images of a pass: :func:`.cache.run_chunked` gives a call as many as the batch holds)."""
    plan = plan_model(
        model,
        input_shape,
        method=engine["method"],
        k=engine["k"],
        power_iters=engine["power_iters"],
        batch_size=batch_size,
        chunk_size=batch_size,
        images=batch_size,  # enough images that the pass, not the model's count, is the limit
        layers=engine.get("layers"),
    )
    return plan.peak_memory_bytes


def memory_batch_size(
    model: Any,
    images: torch.Tensor,
    engine: Mapping[str, Any],
    device: torch.device,
    *,
    free_bytes: float | None = None,
    fraction: float = FREE_FRACTION,
) -> int:
    """``batch_size`` for ``model`` on ``device``: the largest whose planned pass fits in
    ``fraction`` of the free memory (``free_bytes``; default ``torch.cuda.mem_get_info``) plus
    the model's own parameters, which are on the device already and counted in the estimate."""
    if free_bytes is None:
        free_bytes = float(torch.cuda.mem_get_info(device)[0])
    module = Readout(model).module
    tensors = [*module.parameters(), *module.buffers()] if module is not None else []
    params = sum(t.numel() * t.element_size() for t in tensors)
    shape = tuple(images.shape[1:])
    return fitting_batch_size(
        lambda batch: planned_pass_bytes(model, shape, engine, batch),
        fraction * free_bytes + params,
        k=engine["k"],
    )


def pass_width(methods: Mapping[str, str], d_out: Mapping[str, int], k: int) -> int:
    """Products one image takes in the engine's pass that holds the most images per product: k
    when a tap is randomized (``batch_size // k`` images a pass), else the widest exact tap's d
    (``batch_size // d`` images)."""
    if any(method == "randomized" for method in methods.values()):
        return int(k)
    return max((int(d_out[name]) for name in methods), default=int(k))


def measured_batch_size(
    peak_bytes: float,
    batch_size: int,
    call_images: int,
    width: int,
    free_bytes: float,
    *,
    fraction: float = FREE_FRACTION,
    cap: int = MAX_BATCH_SIZE,
) -> tuple[int, float]:
    """(``batch_size`` for the passes after a measured one, the measured peak bytes per image).

    ``peak_bytes``: what one engine call of ``call_images`` images at ``batch_size`` products
    a pass allocated above what stayed allocated after it (``torch.cuda.max_memory_allocated``
    less ``memory_allocated``); its widest pass held ``min(batch_size // width, call_images)``
    images (at least one, :func:`pass_width`). The memory of a pass grows with its images, so
    the next passes hold as many images as ``fraction`` of ``free_bytes`` takes at the measured
    bytes per image (a part that does not grow with the images only makes it smaller: safe),
    ``width`` products each; below one image, the products of that one image scaled down.
    """
    images = min(max(1, batch_size // width), max(1, call_images))
    per_image = max(float(peak_bytes), 1.0) / images
    fit = fraction * free_bytes / per_image
    sized = int(fit) * width if fit >= 1 else int(fit * width)
    return max(1, min(cap, sized)), per_image

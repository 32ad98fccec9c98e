"""The pass size of the Jacobian engine on a GPU: the largest ``batch_size`` (Jacobian-vector
products evaluated together) whose memory, as the planner estimates it
(:func:`.plan_project.plan_model`: ``P + n A_l + p G_l + rows`` per tap, its maximum over taps),
fits in a fraction of the device's free memory.

The estimate grows with the batch (more images and products in flight, more rows or directions
kept), so the largest fitting batch is found by doubling from k and then bisecting
(:func:`fitting_batch_size`), each step one planner estimate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from repdiag.encoders.jacobian.engine import Readout
from repdiag.encoders.jacobian.plan_project import plan_model

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
        k=int(engine["k"]),
        power_iters=int(engine["power_iters"]),
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
        k=int(engine["k"]),
    )

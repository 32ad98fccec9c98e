"""The training batches of a zoo run, rendered ahead of the step that needs them.

Batch ``t`` is a pure function of ``(scenes, seed, t, batch_size)``
(:func:`repdiag.encoders.zoo.scenes.scene_batch`) turned into tensors by :func:`host_batch`, so
rendering it early, in another thread, gives the same bytes as rendering it in the loop: a run
with prefetch trains exactly as one without. :class:`Prefetcher` keeps ``depth`` batches in
flight in one worker thread; the numpy rasteriser and torch's conversions release the GIL, so
with a spare core the rendering leaves the step's critical path.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from repdiag.encoders.zoo.objectives.base import Batch
from repdiag.encoders.zoo.scenes import SceneBatch, SceneSettings, scene_batch


def to_batch(scenes: SceneBatch, device: torch.device | str) -> Batch:
    """uint8 (B, H, W, 3) scenes -> float (B, 3, H, W) in [0, 1] on ``device``."""
    images = torch.from_numpy(scenes.images).to(device).permute(0, 3, 1, 2).float() / 255.0
    return Batch(
        images=images.contiguous(),
        captions=scenes.captions,
        slot_shape=torch.from_numpy(scenes.slot_shape).to(device),
        slot_colour=torch.from_numpy(scenes.slot_colour).to(device),
        host_labels=(scenes.slot_shape, scenes.slot_colour),
    )


def host_batch(scenes: SceneSettings, seed: int, step: int, batch_size: int, pin: bool) -> Batch:
    """Batch ``step`` of the stream ``seed`` as CPU tensors (page-locked when ``pin``, for an
    asynchronous copy to a GPU): ``to_batch(scene_batch(...), "cpu")``."""
    batch = to_batch(scene_batch(scenes, seed, step, batch_size), "cpu")
    if pin:
        batch.images = batch.images.pin_memory()
        batch.slot_shape = batch.slot_shape.pin_memory()
        batch.slot_colour = batch.slot_colour.pin_memory()
    return batch


def batch_to(batch: Batch, device: torch.device | str) -> Batch:
    """``batch`` on ``device`` (non-blocking from page-locked memory; a no-op on its device)."""
    device = torch.device(device)
    if batch.images.device == device:
        return batch
    return Batch(
        images=batch.images.to(device, non_blocking=True),
        captions=batch.captions,
        slot_shape=batch.slot_shape.to(device, non_blocking=True),
        slot_colour=batch.slot_colour.to(device, non_blocking=True),
        host_labels=batch.host_labels,
    )


class Prefetcher:
    """Batches ``start, start + 1, ..., stop - 1`` of a scene stream, each rendered up to
    ``depth`` steps ahead in one worker thread. Use as a context manager (the worker stops
    at exit) and iterate, or call :meth:`get` with the steps in order."""

    def __init__(
        self,
        scenes: SceneSettings,
        seed: int,
        batch_size: int,
        stop: int,
        device: torch.device | str,
        depth: int = 2,
        start: int = 0,
    ) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self.scenes, self.seed, self.batch_size = scenes, int(seed), int(batch_size)
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda" and torch.cuda.is_available()
        self.next_step, self.stop, self.depth = start, stop, depth
        self.pending: dict[int, Future[Batch]] = {}
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zoo-batches")
        for step in range(start, min(start + depth, stop)):
            self._submit(step)

    def _submit(self, step: int) -> None:
        args = (self.scenes, self.seed, step, self.batch_size, self.pin)
        self.pending[step] = self.pool.submit(host_batch, *args)

    def get(self, step: int) -> Batch:
        """Batch ``step`` on the device; the next step in order only."""
        if step != self.next_step or step >= self.stop:
            raise ValueError(
                f"prefetched batches come in order: asked for step {step}, next is "
                f"{self.next_step} of [.., {self.stop})"
            )
        ahead = step + self.depth
        if ahead < self.stop:
            self._submit(ahead)
        batch = self.pending.pop(step).result()
        self.next_step += 1
        return batch_to(batch, self.device)

    def __iter__(self) -> Iterator[tuple[int, Batch]]:
        while self.next_step < self.stop:
            step = self.next_step
            yield step, self.get(step)

    def close(self) -> None:
        """Stop the worker: batches not started are dropped, a running one finishes alone."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pending.clear()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

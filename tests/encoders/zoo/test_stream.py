"""Prefetched batches (repdiag.encoders.zoo.stream): the bytes of in-loop rendering, in order,
and a worker's error surfaces in the step that needed its batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.encoders.zoo.scenes import SceneSettings, scene_batch
from repdiag.encoders.zoo.stream import Prefetcher, batch_to, host_batch, to_batch

SMALL = SceneSettings.from_config(
    {"grid": (2, 2), "min_objects": 1, "max_objects": 3}, 32, arrangement_groups=1
)
GROUPED = SceneSettings.from_config(
    {"grid": (2, 2), "min_objects": 2, "max_objects": 3}, 32, arrangement_groups=3
)


def same_bytes(got, expected) -> None:
    for name in ("images", "slot_shape", "slot_colour"):
        a, b = getattr(got, name), getattr(expected, name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), name
        assert a.numpy().tobytes() == b.numpy().tobytes(), name
    assert got.captions == expected.captions


@pytest.mark.parametrize("scenes", [SMALL, GROUPED], ids=["plain", "arrangement_groups"])
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_prefetched_batches_are_the_bytes_of_in_loop_rendering(scenes, seed):
    start, stop = 3, 8
    with Prefetcher(scenes, seed, 6, stop, "cpu", depth=2, start=start) as stream:
        steps = []
        for step, batch in stream:
            steps.append(step)
            same_bytes(batch, to_batch(scene_batch(scenes, seed, step, 6), "cpu"))
    assert steps == list(range(start, stop))


def test_host_batch_is_to_batch_of_scene_batch():
    for step in (0, 5):
        same_bytes(
            host_batch(SMALL, 2, step, 4, False), to_batch(scene_batch(SMALL, 2, step, 4), "cpu")
        )


def test_the_depth_does_not_change_the_batches():
    shallow = Prefetcher(SMALL, 4, 5, 4, "cpu", depth=1)
    deep = Prefetcher(SMALL, 4, 5, 4, "cpu", depth=4)
    try:
        for step in range(4):
            same_bytes(shallow.get(step), deep.get(step))
    finally:
        shallow.close()
        deep.close()


def test_batches_come_in_order_only():
    with Prefetcher(SMALL, 0, 2, 5, "cpu") as stream:
        stream.get(0)
        with pytest.raises(ValueError, match="in order: asked for step 2, next is 1"):
            stream.get(2)
        stream.get(1)
    with Prefetcher(SMALL, 0, 2, 1, "cpu") as stream:
        stream.get(0)
        with pytest.raises(ValueError, match="asked for step 1"):
            stream.get(1)
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Prefetcher(SMALL, 0, 2, 5, "cpu", depth=0)


def test_a_rendering_error_is_raised_by_the_step_that_needs_the_batch():
    with Prefetcher(SMALL, -1, 2, 3, "cpu") as stream:  # numpy refuses a negative seed
        with pytest.raises(ValueError, match="negative"):
            stream.get(0)


def test_batch_to_its_own_device_is_the_batch_itself():
    batch = host_batch(SMALL, 0, 0, 2, False)
    assert batch_to(batch, "cpu") is batch
    assert np.array_equal(
        batch.images.numpy(), to_batch(scene_batch(SMALL, 0, 0, 2), "cpu").images.numpy()
    )
    assert batch.images.dtype == torch.float32 and batch.images.is_contiguous()

"""The engine's pass size from the planner's memory estimate (repdiag.encoders.jacobian.pass_size):
the largest batch that fits, found by doubling and bisection; with room, a pass holds far more
than 256 products."""

from __future__ import annotations

import pytest
import torch

from repdiag.encoders.jacobian.pass_size import (
    MAX_BATCH_SIZE,
    fitting_batch_size,
    measured_batch_size,
    memory_batch_size,
    pass_width,
    planned_pass_bytes,
)
from tests.encoders.jacobian.models import engine, images, tiny_vit

torch.set_num_threads(1)
GiB = 1 << 30


@pytest.mark.parametrize(
    ("per_product", "budget", "k", "expected_range"),
    [
        (1000.0, 1e9, 32, (MAX_BATCH_SIZE, MAX_BATCH_SIZE)),  # everything fits: the cap
        (1000.0, 1e6 + 5e5, 32, (1088, 1500)),  # fits up to 1500 products; within 1/8 of it
        (1000.0, 10.0, 32, (32, 32)),  # nothing fits: k, the least a pass can hold
    ],
)
def test_fitting_batch_size_is_the_largest_that_fits(per_product, budget, k, expected_range):
    calls = []

    def estimate(batch: int) -> float:
        calls.append(batch)
        return 100.0 + per_product * batch if batch > 32 else per_product * batch

    batch = fitting_batch_size(estimate, budget, k=k)
    low, high = expected_range
    assert low <= batch <= high and batch % k == 0
    assert estimate(batch) <= budget or batch == k
    assert len(calls) <= 30  # doubling and bisection, not a scan


def test_planned_memory_grows_with_the_batch_and_sizes_a_pass_beyond_256():
    model, x = tiny_vit().eval().requires_grad_(False), images(2, (3, 32, 32))
    settings = engine(method="randomized", k=8, power_iters=1)
    small, large = (planned_pass_bytes(model, (3, 32, 32), settings, b) for b in (64, 1024))
    assert 0 < small < large
    # room for 1024 products but not for twice as many: the sized batch lies in between
    room = large + (planned_pass_bytes(model, (3, 32, 32), settings, 2048) - large) / 2
    params = sum(t.numel() * t.element_size() for t in model.parameters()) + sum(
        t.numel() * t.element_size() for t in model.buffers()
    )
    batch = memory_batch_size(
        model, x, settings, torch.device("cpu"), free_bytes=(room - params) / 0.8
    )
    assert 1024 <= batch < 2048 and batch % 8 == 0 and batch > 256
    assert planned_pass_bytes(model, (3, 32, 32), settings, batch) <= room


def test_pass_width_is_k_with_a_randomized_tap_else_the_widest_exact_one():
    assert pass_width({"a": "exact", "b": "randomized"}, {"a": 64, "b": 768}, 32) == 32
    assert pass_width({"a": "exact", "b": "exact"}, {"a": 64, "b": 768}, 32) == 768


@pytest.mark.parametrize(
    ("peak", "batch", "call_images", "width", "free", "expected"),
    [
        # 4 images a pass took 4 GiB: 1 GiB each; 80% of 20 GiB holds 16 images of k = 32
        (4 * GiB, 128, 100, 32, 20 * GiB, (512, GiB)),
        # the call had 2 images only (fewer than the pass could hold): 2 GiB each
        (4 * GiB, 128, 2, 32, 20 * GiB, (256, 2 * GiB)),
        # exact taps of d = 768: one image a pass at 768 products
        (3 * GiB, 768, 10, 768, 10 * GiB, (768 * 2, 3 * GiB)),
        # not even one image fits: that image's products scaled down
        (8 * GiB, 64, 8, 32, 4 * GiB, (25, 4 * GiB)),
    ],
)
def test_measured_batch_size_holds_the_images_the_free_memory_takes(
    peak, batch, call_images, width, free, expected
):
    size, per_image = measured_batch_size(peak, batch, call_images, width, free)
    assert (size, per_image) == (expected[0], pytest.approx(expected[1]))

"""The rasteriser: exact areas and centroids, anti-aliasing, containment in the slot cell."""

from __future__ import annotations

import math

import numpy as np
import pytest

from repdiag.common.render import (
    BASE_SHAPES,
    BENCHMARK_SHAPES,
    SHAPE_AREA,
    SHAPES,
    Jitter,
    SceneObject,
    max_radius,
    render_scene,
    render_scenes,
    slot_cell,
)
from repdiag.core.errors import RegistryError

WHITE = (255, 255, 255)


def _coverage(image: np.ndarray) -> np.ndarray:
    """Covered fraction per pixel of a white-on-black image."""
    return image[..., 0].astype(np.float64) / 255.0


def _centroid(weights: np.ndarray) -> tuple[float, float]:
    """Weighted mean of pixel centres (y, x)."""
    ys, xs = np.indices(weights.shape) + 0.5
    return float((weights * ys).sum() / weights.sum()), float((weights * xs).sum() / weights.sum())


def test_registry_has_benchmark_and_extra_shapes() -> None:
    assert set(BENCHMARK_SHAPES) <= set(SHAPES.names())
    assert len(set(SHAPES.names()) - set(BENCHMARK_SHAPES)) >= 4


@pytest.mark.parametrize("name", SHAPES.names())
def test_every_shape_lies_in_the_unit_disc_and_is_not_degenerate(name: str) -> None:
    axis = np.linspace(-1.5, 1.5, 601)
    u, v = np.meshgrid(axis, axis)
    inside = SHAPES.get(name)(u, v)
    assert not np.any(inside & (u * u + v * v > 1.0 + 1e-9))
    area = inside.mean() * 3.0**2
    assert 1.0 < area < math.pi


def test_axis_aligned_square_has_exact_area_and_centroid() -> None:
    # a 20 px square centred on pixel edge 32 covers pixels 22..41 exactly
    side = 20.0
    size = (
        side / math.sqrt(SHAPE_AREA) / max_radius(64, (1, 1))
    )  # a square of area A has side sqrt(A)
    image = render_scene([SceneObject("square", 0, WHITE)], 64, (1, 1), object_size=size)
    expected = np.zeros((64, 64))
    expected[22:42, 22:42] = 1.0
    np.testing.assert_array_equal(_coverage(image), expected)
    assert _centroid(_coverage(image)) == (32.0, 32.0)


def test_square_in_a_slot_sits_at_the_cell_centre() -> None:
    image = render_scene([SceneObject("square", 5, WHITE)], (60, 90), (2, 3))
    y0, y1, x0, x1 = slot_cell(5, (60, 90), (2, 3))
    cy, cx = _centroid(_coverage(image))
    assert cy == pytest.approx((y0 + y1) / 2, abs=0.05)
    assert cx == pytest.approx((x0 + x1) / 2, abs=0.05)
    radius = 0.7 * max_radius((60, 90), (2, 3))
    side = math.sqrt(SHAPE_AREA) * radius  # 4x4 supersampling places axis-aligned edges to 1/4 px
    assert _coverage(image).sum() == pytest.approx(side**2, abs=2 * side * 0.25)


@pytest.mark.parametrize("name", SHAPES.names())
def test_every_shape_has_the_common_area_in_closed_form(name: str) -> None:
    _, base_area, circumradius = BASE_SHAPES[name]
    axis = np.linspace(-1.0, 1.0, 2001) + 0.5 / 2001  # off the grid's symmetry lines
    u, v = np.meshgrid(axis, axis)
    scale = math.sqrt(SHAPE_AREA / base_area)
    assert SHAPES.get(name)(u, v).mean() * 4.0 == pytest.approx(SHAPE_AREA, rel=0.005)
    assert BASE_SHAPES[name][0](u / scale, v / scale).mean() * 4.0 == pytest.approx(
        SHAPE_AREA, rel=0.005
    )
    assert circumradius * scale <= 1.0


@pytest.mark.parametrize("name", SHAPES.names())
def test_antialiased_area_matches_the_closed_form(name: str) -> None:
    image = render_scene([SceneObject(name, 0, WHITE, rotation=17.0)], 96, (1, 1), object_size=0.9)
    radius = 0.9 * max_radius(96, (1, 1))
    cover = _coverage(image)
    assert cover.sum() == pytest.approx(SHAPE_AREA * radius**2, rel=0.01)
    assert np.any((cover > 0.05) & (cover < 0.95)), "edges should be anti-aliased"


def test_benchmark_shapes_cover_equal_pixel_areas_at_the_default_size() -> None:
    """At 64 px on a 2x2 grid, with rotation, every shape covers the same area within 5%."""
    areas = {}
    for name in SHAPES.names():
        scenes = [[SceneObject(name, 0, WHITE, rotation=angle)] for angle in (-15.0, 0.0, 9.0)]
        images = render_scenes(scenes, 64, (2, 2), object_size=0.7)
        areas[name] = _coverage(images.mean(axis=0)).sum()
    smallest, largest = min(areas.values()), max(areas.values())
    assert largest / smallest < 1.05, areas


def test_rotation_by_180_degrees_flips_the_triangle() -> None:
    upright = render_scene([SceneObject("triangle", 0, WHITE)], 64, (1, 1))
    flipped = render_scene([SceneObject("triangle", 0, WHITE, rotation=180.0)], 64, (1, 1))
    assert np.abs(upright[::-1].astype(int) - flipped.astype(int)).max() <= 1
    assert not np.array_equal(upright, flipped)
    # apex up: the triangle's mass lies below its bounding-box middle
    cy, _ = _centroid(_coverage(upright))
    rows = np.flatnonzero(_coverage(upright).sum(axis=1))
    assert cy > (rows[0] + rows[-1] + 1) / 2


def test_colour_and_background_are_exact_away_from_edges() -> None:
    image = render_scene([SceneObject("square", 0, (10, 200, 30))], 64, (1, 1), (90, 90, 90))
    assert tuple(image[32, 32]) == (10, 200, 30)
    assert tuple(image[0, 0]) == (90, 90, 90)


@pytest.mark.parametrize(("image_size", "grid"), [(32, (2, 2)), (50, (3, 3)), ((40, 70), (2, 5))])
def test_extreme_jitter_never_leaves_the_slot_cell(image_size, grid) -> None:
    rng = np.random.default_rng(1)
    scenes, slots = [], []
    for slot in range(grid[0] * grid[1]):
        for _ in range(12):
            shape = SHAPES.names()[rng.integers(len(SHAPES))]
            dx, dy = rng.choice([-1.0, 1.0], 2)
            scene = [
                SceneObject(
                    shape, slot, WHITE, dx, dy, rng.uniform(0.9, 1.0 / 0.7), rng.uniform(-180, 180)
                )
            ]
            scenes.append(scene)
            slots.append(slot)
    images = render_scenes(scenes, image_size, grid)
    for image, slot in zip(images, slots, strict=True):
        y0, y1, x0, x1 = slot_cell(slot, image_size, grid)
        ys, xs = np.nonzero(image[..., 0])
        assert len(ys) > 0
        assert np.all((ys + 0.5 >= y0) & (ys + 0.5 < y1) & (xs + 0.5 >= x0) & (xs + 0.5 < x1))


def test_batching_and_scene_grouping_do_not_change_pixels() -> None:
    rng = np.random.default_rng(2)
    scenes = [
        [SceneObject(SHAPES.names()[(k + s) % len(SHAPES)], s, (200, 50 * s, 10), *rng.uniform(-1, 1, 2), 1.1, 33.0 * k)
         for s in range(4)]
        for k in range(6)
    ]  # fmt: skip
    together = render_scenes(scenes, 48, (2, 2), (5, 5, 5), batch_points=10_000)
    one_by_one = np.stack([render_scene(scene, 48, (2, 2), (5, 5, 5)) for scene in scenes])
    np.testing.assert_array_equal(together, one_by_one)


def test_invalid_objects_are_rejected() -> None:
    with pytest.raises(ValueError, match="dx, dy"):
        render_scene([SceneObject("circle", 0, WHITE, dx=1.5)], 32, (2, 2))
    with pytest.raises(ValueError, match="object_size"):
        render_scene([SceneObject("circle", 0, WHITE, scale=2.0)], 32, (2, 2))
    with pytest.raises(ValueError, match="slot"):
        render_scene([SceneObject("circle", 4, WHITE)], 32, (2, 2))
    with pytest.raises(RegistryError, match="unknown shape 'blob'"):
        render_scene([SceneObject("blob", 0, WHITE)], 32, (2, 2))


def test_jitter_samples_stay_within_bounds_and_follow_the_seed() -> None:
    jitter = Jitter(position=0.3, scale=0.2, rotation_deg=10.0)
    draws = jitter.sample(np.random.default_rng(0), (500, 4))
    assert np.abs(draws["dx"]).max() <= 0.3 and np.abs(draws["dy"]).max() <= 0.3
    assert 0.8 <= draws["scale"].min() and draws["scale"].max() <= 1.2
    assert np.abs(draws["rotation"]).max() <= 10.0
    assert draws["dx"].std() > 0.1  # really random, not a constant
    again = jitter.sample(np.random.default_rng(0), (500, 4))
    assert all(np.array_equal(draws[k], again[k]) for k in draws)
    with pytest.raises(ValueError, match=r"jitter\.position"):
        Jitter(position=1.5)

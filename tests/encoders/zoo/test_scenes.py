"""The pretraining scene stream: deterministic, labels and captions true to the pixels, its own
palette, never the benchmark's colours."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from repdiag.common.render import SHAPES
from repdiag.core.errors import RegistryError
from repdiag.encoders.zoo.scenes import (
    PALETTE,
    SceneSettings,
    caption,
    caption_vocabulary,
    channel_statistics,
    scene_batch,
    slot_words,
)

SMALL = SceneSettings.from_config(
    {"grid": (2, 2), "min_objects": 1, "max_objects": 3}, 32, arrangement_groups=1
)


def test_batch_is_a_pure_function_of_seed_and_step():
    a, b = scene_batch(SMALL, 5, 7, 6), scene_batch(SMALL, 5, 7, 6)
    assert np.array_equal(a.images, b.images) and a.captions == b.captions
    assert np.array_equal(a.slot_shape, b.slot_shape)
    assert not np.array_equal(a.images, scene_batch(SMALL, 5, 8, 6).images)
    assert not np.array_equal(a.images, scene_batch(SMALL, 6, 7, 6).images)
    assert a.images.dtype == np.uint8 and a.images.shape == (6, 32, 32, 3)


def test_labels_match_the_pixels_of_each_cell():
    batch = scene_batch(SMALL, 0, 0, 32)
    counts = (batch.slot_shape > 0).sum(axis=1)
    assert counts.min() >= 1 and counts.max() <= 3
    assert np.array_equal(batch.slot_shape > 0, batch.slot_colour > 0)
    for image, labels in zip(batch.images, batch.slot_shape, strict=True):
        background = image[0, 0] if labels[0] == 0 else None
        for slot, label in enumerate(labels):
            r, c = divmod(slot, 2)
            cell = image[r * 16 : (r + 1) * 16, c * 16 : (c + 1) * 16].reshape(-1, 3)
            uniform = bool((cell == cell[0]).all())
            assert uniform == (label == 0), (slot, label)  # jitter never leaves the cell
            if label == 0 and background is not None:
                assert (cell == background).all()


def test_captions_name_the_labelled_objects_in_slot_order():
    cfg = SceneSettings.from_config(
        {"grid": (3, 3), "min_objects": 2, "max_objects": 6}, 32, arrangement_groups=1
    )
    batch = scene_batch(cfg, 1, 0, 16)
    for text, shapes, colours in zip(
        batch.captions, batch.slot_shape, batch.slot_colour, strict=True
    ):
        expected = [
            f"{cfg.colours[colours[s] - 1]} {cfg.shapes[shapes[s] - 1]} {slot_words(s, cfg.grid)}"
            for s in range(9)
            if shapes[s]
        ]
        assert text == ", ".join(expected)
        assert set(text.replace(",", " , ").split()) <= set(caption_vocabulary(cfg))


def test_position_words():
    assert [slot_words(s, (2, 2)) for s in range(4)] == [
        "top left",
        "top right",
        "bottom left",
        "bottom right",
    ]
    assert slot_words(4, (3, 3)) == "centre" and slot_words(3, (3, 3)) == "middle left"
    assert caption([("blue", "square", 3), ("red", "circle", 0)], (2, 2)) == (
        "red circle top left, blue square bottom right"
    )


def test_the_benchmark_geometry_but_never_its_colours_or_scenes():
    """Pretraining scenes follow the benchmark's grid, object size and jitter ranges, but draw
    all nine shapes, 2-4 objects and colours none of which is a benchmark colour."""
    cfg = SceneSettings.from_config({}, 64, arrangement_groups=1)  # the schema's scenes
    assert set(cfg.shapes) == set(SHAPES.names()) and len(cfg.shapes) > 4
    schema = Path(__file__).resolve().parents[3] / "schemas" / "datasets.schema.yaml"
    binding = yaml.safe_load(schema.read_text())["properties"]["binding"]["properties"]
    benchmark = {
        tuple(c) for key in ("query_palette", "target_palette") for c in binding[key]["default"]
    }
    assert benchmark and not benchmark & set(PALETTE.values())
    assert list(cfg.grid) == binding["grid"]["default"]
    assert cfg.object_size == binding["object_size"]["default"]
    jitter = binding["jitter"]["properties"]
    assert (cfg.jitter.position, cfg.jitter.scale, cfg.jitter.rotation_deg) == tuple(
        jitter[k]["default"] for k in ("position", "scale", "rotation_deg")
    )
    assert cfg.min_objects < binding["n_objects"]["default"] == cfg.max_objects


def test_channel_statistics_are_the_pixel_moments():
    mean, std = channel_statistics(SMALL, 3, n_images=20)
    pixels = scene_batch(SMALL, 3, 0, 20).images.reshape(-1, 3) / 255.0
    assert mean == pytest.approx(pixels.mean(0), abs=5e-4)
    assert std == pytest.approx(pixels.std(0), abs=5e-4)


@pytest.mark.parametrize(
    ("section", "groups", "error", "message"),
    [
        ({"shapes": ("circle", "blob")}, 1, RegistryError, "unknown shape 'blob'"),
        ({"colours": ("red", "teal-ish")}, 1, ValueError, "unknown scene colours"),
        ({"grid": (2, 2), "max_objects": 5}, 1, ValueError, "max_objects"),
        ({"object_size": 0.95}, 1, ValueError, "objects would leave their cells"),
        ({}, 0, ValueError, "arrangement_groups must be >= 1"),
    ],
)
def test_bad_settings_are_named(section, groups, error, message):
    with pytest.raises(error, match=message):
        SceneSettings.from_config(section, 64, arrangement_groups=groups)


def test_arrangement_groups_share_everything_but_which_shape_is_where():
    cfg = SceneSettings.from_config(
        {"grid": (2, 2), "min_objects": 3, "max_objects": 4}, 32, arrangement_groups=4
    )
    batch = scene_batch(cfg, 3, 2, 10)  # groups of 4, 4 and a short one of 2
    for start, size in ((0, 4), (4, 4), (8, 2)):
        group = slice(start, start + size)
        shapes, colours = batch.slot_shape[group], batch.slot_colour[group]
        # the same occupied slots, the same colour per slot, the same multiset of shapes
        assert (colours == colours[0]).all() and ((shapes > 0) == (shapes[0] > 0)).all()
        assert all(sorted(row) == sorted(shapes[0]) for row in shapes)
        occupied = shapes[0][shapes[0] > 0]
        assert len(set(occupied)) == len(occupied)  # distinct shapes: a permutation is visible
        # distinct arrangements, one per member (3 or 4 objects: at least 6 orderings)
        assert len({tuple(row) for row in shapes}) == size
        # the background is the group's: the corner pixel (no object reaches it) is equal
        corners = batch.images[group][:, 0, 0]
        assert (corners == corners[0]).all()
    # consecutive groups are drawn independently
    assert not np.array_equal(batch.slot_colour[0], batch.slot_colour[4])


def test_one_scene_per_group_is_the_plain_stream():
    plain = scene_batch(SMALL, 5, 7, 6)
    grouped = scene_batch(dataclasses.replace(SMALL, arrangement_groups=1), 5, 7, 6)
    assert np.array_equal(plain.images, grouped.images) and plain.captions == grouped.captions

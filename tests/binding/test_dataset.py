"""The binding dataset: task invariants, balance, determinism, store layout and config checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import xarray as xr
import yaml
from scipy.stats import chi2_contingency

from repdiag.binding.dataset import (
    DIMS,
    BindingSettings,
    check_binding_config,
    chunk_encoding,
    matching_layout,
    n_arrangements,
    pair_layout,
    render_binding_dataset,
)
from repdiag.common.render import Jitter, slot_cell
from repdiag.core.config import fill_defaults, semantic_checks
from repdiag.core.errors import ConfigError
from repdiag.core.store import open_store, write_store

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "datasets.schema.yaml"

SMALL = BindingSettings.from_config(dict(image_size=32, n_queries=20, n_candidates=8, n_pairs=20))
WIDE = BindingSettings.from_config(
    dict(
        image_size=48,
        n_queries=12,
        n_candidates=6,
        n_pairs=12,
        shapes=("circle", "square", "triangle", "cross", "star", "ring"),
        grid=(2, 3),
        n_objects=4,
        jitter=Jitter(position=1.0, scale=0.2, rotation_deg=180.0),
        object_size=0.8,
        background=(128, 128, 128),
        seed=7,
    )
)


@pytest.fixture(scope="module", params=[SMALL, WIDE], ids=["2x2", "2x3"])
def dataset(request: pytest.FixtureRequest) -> tuple[BindingSettings, xr.Dataset]:
    return request.param, render_binding_dataset(request.param)


def _filled_colours(colours: np.ndarray, shapes: np.ndarray) -> set[tuple[int, ...]]:
    return {tuple(int(c) for c in rgb) for rgb in colours[shapes >= 0]}


def _as_rows(values: np.ndarray) -> set[tuple[int, ...]]:
    return {tuple(int(c) for c in row) for row in values}


# --- closed forms and defaults ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("counts", "slots", "expected"),
    [([1, 1, 1], 4, 24), ([1, 1, 1, 1], 4, 24), ([2, 1], 3, 3), ([2, 2], 4, 6), ([1], 4, 4),
     ([1, 1], 9, 72), ([1] * 5, 4, 0)],
)  # fmt: skip
def test_number_of_arrangements(counts: list[int], slots: int, expected: int) -> None:
    assert n_arrangements(counts, slots) == expected


def test_every_default_comes_from_the_schema_and_the_config_round_trips() -> None:
    import dataclasses

    datasets = fill_defaults({}, yaml.safe_load(SCHEMA.read_text()), SCHEMA.parent)
    default = BindingSettings.from_config({})
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(BindingSettings))
    assert BindingSettings.from_config(datasets["binding"]) == default
    assert default.to_config() == datasets["binding"]
    assert BindingSettings.from_config(default.to_config()) == default


# --- the matching task --------------------------------------------------------------------------


def test_store_layout_follows_the_contract(dataset) -> None:
    params, ds = dataset
    assert set(ds.data_vars) == set(DIMS)
    for name, dims in DIMS.items():
        assert ds[name].dims == dims, name
    size, n_s = params.image_size, params.n_slots
    assert ds["query_image"].shape == (params.n_queries, size, size, 3)
    assert ds["candidate_image"].shape == (params.n_queries, params.n_candidates, size, size, 3)
    assert ds["pair_image"].shape == (params.n_pairs, 2, size, size, 3)
    assert ds["query_shape"].shape == (params.n_queries, n_s)
    for name in ("query_image", "candidate_image", "pair_image", "query_colour"):
        assert ds[name].dtype == np.uint8
    assert ds["correct_index"].dtype == np.int64 and ds["pair_same"].dtype == np.int8
    assert ds["candidate_shape"].dtype == np.int8
    assert list(ds["query"].values[:2]) == ["q00000", "q00001"]
    assert list(ds["pair"].values[:1]) == ["p00000"]
    assert list(ds["channel"].values) == ["r", "g", "b"]
    assert list(ds["shape_name"].values) == list(params.shapes)
    assert ds["slot"].values[-1] == f"r{params.grid[0] - 1}c{params.grid[1] - 1}"
    assert list(ds["candidate"].values) == list(range(params.n_candidates))
    assert ds.attrs["chance"] == pytest.approx(1 / params.n_candidates)


def test_every_scene_has_n_objects_distinct_shapes(dataset) -> None:
    params, ds = dataset
    for name in ("query_shape", "candidate_shape", "pair_shape"):
        arrangements = ds[name].values.reshape(-1, params.n_slots)
        filled = arrangements >= 0
        assert np.all(filled.sum(axis=1) == params.n_objects), name
        assert arrangements.max() < len(params.shapes)
        for row in arrangements:
            assert len(set(row[row >= 0])) == params.n_objects


def test_candidates_share_the_query_shape_multiset_and_differ_in_arrangement(dataset) -> None:
    params, ds = dataset
    query, candidates = ds["query_shape"].values, ds["candidate_shape"].values
    np.testing.assert_array_equal(
        np.sort(candidates, axis=-1),
        np.sort(query, axis=-1)[:, None].repeat(params.n_candidates, axis=1),
    )
    for q in range(params.n_queries):
        assert len(_as_rows(candidates[q])) == params.n_candidates  # all arrangements distinct


def _occupancy_and_multiset(shapes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return shapes >= 0, np.sort(shapes, axis=-1)


def test_default_candidates_and_pairs_differ_only_in_which_shape_sits_where() -> None:
    """On the default config's dataset: every candidate of every query has the query's occupied
    slots and shape multiset, and so has member 1 of every pair; only the binding differs."""
    defaults = yaml.safe_load((SCHEMA.parents[1] / "config/config.yaml").read_text())
    ds = render_binding_dataset(BindingSettings.from_config(defaults["datasets"]["binding"]))
    query, candidates = ds["query_shape"].values, ds["candidate_shape"].values
    occupied, multiset = _occupancy_and_multiset(query)
    cand_occupied, cand_multiset = _occupancy_and_multiset(candidates)
    np.testing.assert_array_equal(
        cand_occupied, np.broadcast_to(occupied[:, None], cand_occupied.shape)
    )
    np.testing.assert_array_equal(
        cand_multiset, np.broadcast_to(multiset[:, None], cand_multiset.shape)
    )
    pairs = ds["pair_shape"].values
    pair_occupied, pair_multiset = _occupancy_and_multiset(pairs)
    np.testing.assert_array_equal(pair_occupied[:, 0], pair_occupied[:, 1])
    np.testing.assert_array_equal(pair_multiset[:, 0], pair_multiset[:, 1])
    different = ds["pair_same"].values == 0
    assert np.all(np.any(pairs[different, 0] != pairs[different, 1], axis=-1))
    assert ds.sizes["pair"] >= 2048


def test_candidates_keep_the_occupied_slots_when_the_grid_is_not_full() -> None:
    params = dataclasses.replace(WIDE, n_objects=3, n_candidates=6)  # 3 of 6 slots, 3! = 6
    layout = matching_layout(params, np.random.default_rng(5))
    occupied = layout["query_shape"] >= 0
    assert not np.all(occupied)  # empty slots vary between queries...
    np.testing.assert_array_equal(  # ...but never between a query's candidates
        layout["candidate_shape"] >= 0, np.broadcast_to(occupied[:, None], (12, 6, 6))
    )
    pairs = pair_layout(params, np.random.default_rng(5))["pair_shape"]
    np.testing.assert_array_equal(pairs[:, 0] >= 0, pairs[:, 1] >= 0)


def test_exactly_one_candidate_has_the_query_arrangement(dataset) -> None:
    _, ds = dataset
    matches = np.all(ds["candidate_shape"].values == ds["query_shape"].values[:, None], axis=-1)
    np.testing.assert_array_equal(matches.sum(axis=1), 1)
    np.testing.assert_array_equal(np.argmax(matches, axis=1), ds["correct_index"].values)


def test_query_and_target_colours_come_from_disjoint_palettes(dataset) -> None:
    params, ds = dataset
    assert not set(params.query_palette) & set(params.target_palette)
    assert _filled_colours(ds["query_colour"].values, ds["query_shape"].values) <= set(
        params.query_palette
    )
    assert _filled_colours(ds["candidate_colour"].values, ds["candidate_shape"].values) <= set(
        params.target_palette
    )
    pair_colour, pair_shape = ds["pair_colour"].values, ds["pair_shape"].values
    assert _filled_colours(pair_colour[:, 0], pair_shape[:, 0]) <= set(params.query_palette)
    assert _filled_colours(pair_colour[:, 1], pair_shape[:, 1]) <= set(params.target_palette)


def test_pixels_show_the_recorded_colours_in_the_recorded_slots(dataset) -> None:
    """Each object's colour fills the interior of its own cell; empty cells are background; no
    query-palette colour appears in any candidate image (and vice versa)."""
    params, ds = dataset
    background = np.array(params.background, dtype=np.uint8)
    size = params.image_size
    images = ds["query_image"].values
    for q in range(params.n_queries):
        for slot in range(params.n_slots):
            y0, y1, x0, x1 = slot_cell(slot, size, params.grid)
            cell = images[
                q,
                int(np.ceil(y0 - 0.5)) : int(np.ceil(y1 - 0.5)),
                int(np.ceil(x0 - 0.5)) : int(np.ceil(x1 - 0.5)),
            ]
            pixels = _as_rows(cell.reshape(-1, 3))
            if ds["query_shape"].values[q, slot] < 0:
                assert pixels == {tuple(background.tolist())}
            else:
                assert tuple(ds["query_colour"].values[q, slot].tolist()) in pixels
        # pixels outside every cell do not exist; the whole image is the union of the cells
    candidate_pixels = _as_rows(ds["candidate_image"].values.reshape(-1, 3))
    query_pixels = _as_rows(images.reshape(-1, 3))
    assert not candidate_pixels & set(params.query_palette)
    assert not query_pixels & set(params.target_palette)


def test_jitter_never_moves_an_object_out_of_its_slot(dataset) -> None:
    """Every non-background pixel's centre lies in the cell of an occupied slot."""
    params, ds = dataset
    size, (rows, cols) = params.image_size, params.grid
    centres = np.arange(size) + 0.5
    cell_of_pixel = (
        np.floor(centres * rows / size)[:, None] * cols + np.floor(centres * cols / size)[None, :]
    ).astype(int)
    background = np.array(params.background, dtype=np.uint8)
    images = np.concatenate(
        [ds["query_image"].values, ds["candidate_image"].values.reshape(-1, size, size, 3)]
    )
    shapes = np.concatenate(
        [ds["query_shape"].values, ds["candidate_shape"].values.reshape(-1, params.n_slots)]
    )
    for image, arrangement in zip(images, shapes, strict=True):
        drawn = np.any(image != background, axis=-1)
        touched = set(np.unique(cell_of_pixel[drawn]).tolist())
        assert touched == set(np.flatnonzero(arrangement >= 0).tolist())


def test_correct_index_and_colours_carry_no_information() -> None:
    params = dataclasses.replace(SMALL, n_queries=1200)
    layout = matching_layout(params, np.random.default_rng(3))
    correct = layout["correct_index"]
    counts = np.bincount(correct, minlength=params.n_candidates)
    assert chi2_contingency(np.stack([counts, np.full_like(counts, counts.mean())]))[1] > 0.01
    # target-colour frequencies of the correct candidate vs the distractors
    palette = {rgb: i for i, rgb in enumerate(params.target_palette)}
    is_correct = np.arange(params.n_candidates)[None, :] == correct[:, None]
    table = np.zeros((2, len(palette)), dtype=int)
    colours, shapes = layout["candidate_colour"], layout["candidate_shape"]
    for q, c, s in zip(*np.nonzero(shapes >= 0), strict=True):
        table[int(is_correct[q, c]), palette[tuple(colours[q, c, s].tolist())]] += 1
    assert chi2_contingency(table)[1] > 0.01


# --- Same/Different pairs -----------------------------------------------------------------------


def test_pairs_are_balanced_and_labelled_by_arrangement(dataset) -> None:
    params, ds = dataset
    same = ds["pair_same"].values
    assert same.sum() == params.n_pairs // 2 and set(np.unique(same)) == {0, 1}
    member0, member1 = ds["pair_shape"].values[:, 0], ds["pair_shape"].values[:, 1]
    identical = np.all(member0 == member1, axis=-1)
    np.testing.assert_array_equal(identical, same.astype(bool))
    # different pairs keep the shapes: only the arrangement differs
    np.testing.assert_array_equal(np.sort(member0, axis=-1), np.sort(member1, axis=-1))
    # same pairs still differ in pixels (other palette, other jitter)
    images = ds["pair_image"].values
    assert all(not np.array_equal(images[p, 0], images[p, 1]) for p in range(params.n_pairs))


def test_pair_labels_are_shuffled_not_alternating() -> None:
    layout = pair_layout(dataclasses.replace(SMALL, n_pairs=400), np.random.default_rng(0))
    same = layout["pair_same"]
    assert same.sum() == 200
    assert (
        0.3 < np.mean(same[1:] != same[:-1]) < 0.7
    )  # an i.i.d. order changes label ~half the time


# --- determinism --------------------------------------------------------------------------------


def test_same_seed_gives_the_same_bytes_and_another_seed_does_not() -> None:
    params = dataclasses.replace(SMALL, n_queries=6, n_pairs=6)
    first, second = render_binding_dataset(params), render_binding_dataset(params)
    for name in first.data_vars:
        assert first[name].values.tobytes() == second[name].values.tobytes(), name
    assert first.coords.to_dataset().identical(second.coords.to_dataset())
    other = render_binding_dataset(dataclasses.replace(params, seed=1))
    assert not np.array_equal(first["query_image"].values, other["query_image"].values)


def test_changing_only_n_pairs_keeps_the_matching_task() -> None:
    params = dataclasses.replace(SMALL, n_queries=5, n_pairs=4)
    base = render_binding_dataset(params)
    more = render_binding_dataset(dataclasses.replace(params, n_pairs=8))
    for name in ("query_image", "candidate_image", "correct_index", "candidate_colour"):
        np.testing.assert_array_equal(base[name].values, more[name].values)


# --- the store -----------------------------------------------------------


def test_store_round_trip_with_provenance(tmp_path: Path) -> None:
    params = dataclasses.replace(SMALL, n_queries=5, n_pairs=4)
    ds = render_binding_dataset(params)
    path = tmp_path / "binding.zarr"
    write_store(
        path,
        ds,
        config=params.to_config(),
        seed=params.seed,
        encoding=chunk_encoding(ds, chunk_bytes=10_000),
    )
    assert not [p for p in tmp_path.iterdir() if p.name != "binding.zarr"]  # no temporary left over
    lazy = xr.open_zarr(path)
    assert lazy["candidate_image"].dims == DIMS["candidate_image"]
    assert lazy["candidate_image"].encoding["chunks"][0] == 1  # 10 kB chunks: one query each
    back = open_store(path, required=list(DIMS))
    for name in ds.variables:
        np.testing.assert_array_equal(back[name].values, ds[name].values)
    assert back.attrs["provenance"]["config"] == params.to_config()
    assert back.attrs["provenance"]["seed"] == params.seed


# --- config checks ------------------------------------------------------------------------------


def _config(**binding) -> dict:
    return {"datasets": {"binding": binding}}


def test_semantic_check_is_registered() -> None:
    assert check_binding_config in semantic_checks()
    check_binding_config(_config())  # the defaults pass
    check_binding_config({"datasets": {}})  # no binding section: nothing to check


@pytest.mark.parametrize(
    ("binding", "key"),
    [
        ({"n_objects": 1, "n_candidates": 8}, "datasets.binding.n_candidates"),
        ({"n_objects": 3, "n_candidates": 8}, "datasets.binding.n_candidates"),  # 3! = 6 < 8
        ({"grid": [3, 3], "n_objects": 3, "n_candidates": 7}, "datasets.binding.n_candidates"),
        ({"n_objects": 5, "grid": [1, 4]}, "datasets.binding.n_objects"),
        ({"n_objects": 5, "grid": [3, 3]}, "datasets.binding.n_objects"),
        ({"shapes": ["circle", "blob", "square"]}, "datasets.binding.shapes"),
        ({"target_palette": [[1, 2, 3], [230, 25, 75]]}, "datasets.binding.target_palette"),
        ({"background": [0, 130, 200]}, "datasets.binding.background"),
        ({"jitter": {"scale": 0.5}}, "datasets.binding.jitter.scale"),
        ({"jitter": {"spin": 3}}, "datasets.binding.jitter"),
        ({"image_size": 16, "grid": [3, 3]}, "datasets.binding.image_size"),
        ({"n_pairs": 7}, "datasets.binding.n_pairs"),
        ({"colour": "red"}, "datasets.binding.colour"),
        ({"n_queries": "many"}, "datasets.binding.n_queries"),
        ({"background": [1, 2]}, "datasets.binding.background"),
        ({"background": [300, 0, 0]}, "datasets.binding.background"),
    ],
)
def test_semantic_check_names_the_key(binding: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_binding_config(_config(**binding))
    assert key in str(err.value)


@pytest.mark.parametrize(
    ("binding", "key"),
    [({"n_candidates": "eight"}, "n_candidates"), ({"image_size": 8}, "image_size"),
     ({"grid": [2, 2, 2]}, "grid"), ({"palette": []}, "palette"), ({"n_pairs": 3}, "n_pairs"),
     ({"query_palette": [[300, 0, 0]]}, "query_palette")],
)  # fmt: skip
def test_schema_rejects_bad_values_naming_the_key(binding: dict, key: str) -> None:
    schema = yaml.safe_load(SCHEMA.read_text())
    jsonschema.validate({"binding": {}}, schema)
    with pytest.raises(jsonschema.ValidationError) as err:
        jsonschema.validate({"binding": binding}, schema)
    assert key in (str(err.value.message) + " ".join(map(str, err.value.absolute_path)))

"""repdiag.binding.store: the contract-checked reader, flat image sets and slot attributes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from repdiag.binding.dataset import BindingSettings, chunk_encoding, render_binding_dataset
from repdiag.binding.store import image_sets, open_binding_store, slot_attributes
from repdiag.core.errors import StoreError
from repdiag.core.store import write_store

SMALL = BindingSettings.from_config(dict(image_size=32, n_queries=4, n_candidates=8, n_pairs=6))


def test_image_sets_flatten_in_the_documented_order() -> None:
    ds = render_binding_dataset(SMALL)
    sets = image_sets(ds)
    ids, images = sets["candidate"]
    assert images.shape == (4 * 8, 32, 32, 3) and images.dtype == np.uint8
    k = list(ids).index("candidate/q00003/c5")
    assert k == 3 * 8 + 5
    np.testing.assert_array_equal(images[k], ds["candidate_image"].values[3, 5])
    ids, images = sets["pair"]
    k = list(ids).index("pair/p00004/m1")
    assert k == 4 * 2 + 1
    np.testing.assert_array_equal(images[k], ds["pair_image"].values[4, 1])
    ids, images = sets["query"]
    assert list(ids) == ["query/q00000", "query/q00001", "query/q00002", "query/q00003"]
    np.testing.assert_array_equal(images, ds["query_image"].values)


def test_slot_attributes_are_the_recorded_shape_of_every_slot_of_every_image() -> None:
    ds = render_binding_dataset(SMALL)
    ids, names, indicators = slot_attributes(ds)
    sets = image_sets(ds)
    np.testing.assert_array_equal(ids, np.concatenate([sets[s][0] for s in sets]))
    slots, shapes = ds["slot"].values.astype(str), ds["shape_name"].values.astype(str)
    assert names[: len(shapes)] == [f"{slots[0]}={shape}" for shape in shapes]
    assert indicators.shape == (len(ids), len(slots) * len(shapes))
    row = list(ids).index("candidate/q00003/c5")
    recorded = ds["candidate_shape"].values[3, 5]
    for slot, shape in enumerate(recorded):
        block = indicators[row, slot * len(shapes) : (slot + 1) * len(shapes)]
        assert block.sum() == (shape >= 0) and (shape < 0 or block[shape] == 1)
    row = list(ids).index("pair/p00004/m1")
    expected = ds["pair_shape"].values[4, 1]
    got = indicators[row].reshape(len(slots), len(shapes)).argmax(1)
    np.testing.assert_array_equal(got[expected >= 0], expected[expected >= 0])


def test_open_binding_store_gives_str_coordinates_and_refuses_a_broken_contract(
    tmp_path: Path,
) -> None:
    ds = render_binding_dataset(SMALL)
    path = tmp_path / "binding.zarr"
    write_store(path, ds, config=SMALL.to_config(), seed=0, encoding=chunk_encoding(ds))
    back = open_binding_store(path, variables=["query_image", "correct_index"])
    assert set(back.data_vars) == {"query_image", "correct_index"}
    assert back["query"].values.dtype.kind == "U" and back["query"].values[0] == "q00000"
    np.testing.assert_array_equal(back["query_image"].values, ds["query_image"].values)
    broken = tmp_path / "broken.zarr"
    wrong = ds.assign(correct_index=ds["correct_index"].astype("float32"))
    write_store(broken, wrong, config=SMALL.to_config(), seed=0, encoding=chunk_encoding(ds))
    with pytest.raises(StoreError, match="correct_index"):
        open_binding_store(broken)

"""A store is read only if it is what write_store writes: checked on files and metadata."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from repdiag.core.errors import StoreError
from repdiag.core.store import store_arrays, write_store
from repdiag.core.store_preflight import (
    DECODE_FLOOR,
    check_decoded_bytes,
    check_name,
    declared_sizes,
    decode_ratio,
    disk_bytes,
)


def _store(path: Path) -> Path:
    ds = xr.Dataset(
        {"emb": (("image", "d"), np.arange(12, dtype=np.float32).reshape(3, 4))},
        coords={"image": np.array(["a", "b", "c"], dtype=object)},
    )
    return write_store(path, ds)


def _edit_entry(path: Path, name: str, edit) -> None:
    """Apply ``edit`` to the array's zarr.json and its consolidated entry alike."""
    group = json.loads((path / "zarr.json").read_text())
    edit(group["consolidated_metadata"]["metadata"][name])
    (path / "zarr.json").write_text(json.dumps(group))
    meta = json.loads((path / name / "zarr.json").read_text())
    edit(meta)
    (path / name / "zarr.json").write_text(json.dumps(meta))


def test_a_store_written_here_passes(tmp_path):
    assert sorted(store_arrays(_store(tmp_path / "s.zarr"))) == ["emb", "image"]


def test_disk_bytes_are_the_chunk_bytes_per_array(tmp_path):
    path = _store(tmp_path / "s.zarr")
    sizes = disk_bytes(path)
    assert set(sizes) == {"emb", "image"}  # metadata counts for nothing
    chunks = [f for f in (path / "emb" / "c").rglob("*") if f.is_file()]
    assert sizes["emb"] == sum(f.stat().st_size for f in chunks)


def test_a_sparse_padding_file_adds_only_its_allocated_bytes(tmp_path):
    """Issue 60: a 2 GB sparse file among the chunks (100 KB on disk) lifted the decode ratio."""
    path = _store(tmp_path / "s.zarr")
    before = disk_bytes(path)["emb"]
    with open(path / "emb" / "c" / "padding", "wb") as padding:
        padding.truncate(2 << 30)  # apparent 2 GiB, no block allocated
    assert (path / "emb" / "c" / "padding").stat().st_size == 2 << 30
    assert disk_bytes(path)["emb"] - before <= 4096
    image = disk_bytes(path)["image"]
    (path / "image" / "stray").write_bytes(b"x" * 10_000)  # beside the chunks: not counted
    assert disk_bytes(path)["image"] == image


@pytest.mark.parametrize("name", ["../other.zarr/emb", "a/b", "..", "x..y", "", "a\\b"])
def test_names_that_leave_the_store_are_refused(tmp_path, name):
    with pytest.raises(StoreError, match="is not a plain array name"):
        check_name(tmp_path, name)


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (lambda m: m.pop("node_type"), r"entry 'emb' is not a zarr format 3 array"),
        (lambda m: m.update(zarr_format=2), r"zarr_format 2"),
        (
            lambda m: m.update(codecs=[{"name": "sharding_indexed", "configuration": {}}]),
            r"uses codecs \['sharding_indexed'\]",
        ),
        (lambda m: m["codecs"].append({"name": "blosc"}), r"uses codecs \['blosc'\]"),
        (lambda m: m.update(chunk_grid={"name": "rectilinear"}), "chunk grid 'rectilinear'"),
        (
            lambda m: m.update(chunk_key_encoding={"name": "v2", "configuration": {}}),
            "chunk keys",
        ),
        (lambda m: m.update(storage_transformers=[{"name": "x"}]), "storage transformers"),
        (lambda m: m.update(data_type="complex128"), "data type 'complex128'"),
    ],
    ids=["v2-entry", "format-2", "sharding", "blosc", "grid", "keys", "transformer", "complex"],
)
def test_entries_not_written_here_are_refused_by_name(tmp_path, edit, pattern):
    path = _store(tmp_path / "s.zarr")
    _edit_entry(path, "emb", edit)
    with pytest.raises(StoreError, match=pattern):
        store_arrays(path)


def test_v2_files_links_and_fifos_anywhere_are_refused(tmp_path):
    import os

    path = _store(tmp_path / "s.zarr")
    (path / "emb" / "c" / ".zarray").write_text("{}")
    with pytest.raises(StoreError, match=r"emb/c/\.zarray is a zarr format 2 entry"):
        store_arrays(path)
    (path / "emb" / "c" / ".zarray").unlink()
    os.mkfifo(path / "image" / "pipe")
    with pytest.raises(StoreError, match=r"image/pipe is neither a file nor a folder"):
        store_arrays(path)
    (path / "image" / "pipe").unlink()
    link = tmp_path / "link.zarr"
    link.symlink_to(path, target_is_directory=True)
    with pytest.raises(StoreError, match=r"it is a symbolic link"):
        store_arrays(link)


def test_declared_sizes_count_strings_and_fixed_width_text():
    entry = {
        "shape": [10, 3],
        "chunk_grid": {"configuration": {"chunk_shape": [5, 3]}},
        "data_type": {"name": "fixed_length_utf32", "configuration": {"length_bytes": 12}},
    }
    assert declared_sizes(entry) == (360, 2, 180)
    assert declared_sizes({**entry, "data_type": "string"}) == (30 * 64, 2, 15 * 64)
    assert declared_sizes({**entry, "data_type": "int16"}) == (60, 2, 30)


def test_decoded_bytes_are_bounded_by_ratio_floor_and_cap(tmp_path, monkeypatch):
    check_decoded_bytes(tmp_path, {"a": DECODE_FLOOR}, {"a": 1})  # the floor
    check_decoded_bytes(tmp_path, {"a": 1000 << 20}, {"a": 1 << 20})  # the ratio
    with pytest.raises(StoreError, match=r"array 'a' decodes to \d+ bytes from 1 on disk"):
        check_decoded_bytes(tmp_path, {"a": DECODE_FLOOR + 1}, {"a": 1})
    with pytest.raises(StoreError, match=r"its arrays decode to"):  # each at the floor
        check_decoded_bytes(tmp_path, {"a": DECODE_FLOOR, "b": DECODE_FLOOR}, {"a": 1, "b": 1})
    monkeypatch.setenv("REPDIAG_STORE_DECODE_RATIO", "5000")
    assert decode_ratio() == 5000
    monkeypatch.setenv("REPDIAG_STORE_DECODE_RATIO", "0")
    with pytest.raises(StoreError, match="REPDIAG_STORE_DECODE_RATIO='0'"):
        decode_ratio()

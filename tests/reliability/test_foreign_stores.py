"""Stores this workflow did not write (issue "one store reader"): zarr v2 entries, a pickle codec,
sharded arrays, a 1 GiB coordinate in a 100 KB store, entry names that leave the store, linked
arrays. Each is refused by name through the real readers (``open_binding_store``,
``open_store``, ``repdiag inspect``) before any chunk is decoded; resource cases run in a
subprocess that reports its own peak memory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from repdiag.binding.dataset import BindingParams, chunk_encoding, render_binding_dataset
from repdiag.binding.store import open_binding_store
from repdiag.core.errors import StoreError
from repdiag.core.store import DEFAULT_COMPRESSORS, open_store, with_checksum, write_store
from tests.reliability.memory import run_measured

REPO = Path(__file__).resolve().parents[2]
SMALL = BindingParams(image_size=32, n_queries=4, n_candidates=8, n_pairs=6)
HANG_GUARD_S = 300  # only against a hang; nothing is timed


def _binding(path: Path) -> Path:
    ds = render_binding_dataset(SMALL)
    return write_store(path, ds, config=SMALL.to_config(), seed=0, encoding=chunk_encoding(ds))


def _entries(path: Path) -> dict:
    return json.loads((path / "zarr.json").read_text())["consolidated_metadata"]["metadata"]


def _set_entry(path: Path, name: str, entry: dict | None) -> None:
    group = json.loads((path / "zarr.json").read_text())
    metadata = group["consolidated_metadata"]["metadata"]
    if entry is None:
        metadata.pop(name)
    else:
        metadata[name] = entry
    (path / "zarr.json").write_text(json.dumps(group))


def _in_subprocess(code: str, env: dict | None = None) -> dict:
    """Run ``code`` (which sets ``result``) in a fresh interpreter; its result and peak RSS."""
    return run_measured(code, env=env)


def test_a_v2_entry_in_place_of_query_image_is_refused_naming_it(tmp_path):
    """Before: no node_type, so no check applied, and 24 all-black queries went to extraction."""
    path = _binding(tmp_path / "binding.zarr")
    entry = _entries(path)["query_image"]
    shutil.rmtree(path / "query_image")
    _set_entry(path, "query_image", {"shape": entry["shape"], "dtype": "|u1", "zarr_format": 2})
    with pytest.raises(StoreError, match=r"entry 'query_image' is not a zarr format 3 array"):
        open_binding_store(path)


def test_a_v2_pickle_entry_runs_nothing_even_with_unsafe_decoding_allowed(tmp_path):
    path = _binding(tmp_path / "binding.zarr")
    marker = tmp_path / "marker"
    evil = path / "evil"
    evil.mkdir()
    meta = {
        "zarr_format": 2,
        "shape": [1],
        "chunks": [1],
        "dtype": "|O",
        "compressor": None,
        "filters": [{"id": "pickle"}],
        "fill_value": None,
        "order": "C",
    }
    (evil / ".zarray").write_text(json.dumps(meta))

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    import pickle

    (evil / "0").write_bytes(pickle.dumps(np.array([Payload()], dtype=object)))
    _set_entry(path, "evil", meta)
    env = {**os.environ, "NUMCODECS_ALLOW_UNSAFE_PICKLE_DECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "repdiag.cli", "inspect", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env=env,
        check=False,
    )
    assert proc.returncode != 0
    assert "repdiag: error:" in proc.stderr and "evil/.zarray is a zarr format 2 entry" in (
        proc.stderr
    ), proc.stderr[-2000:]
    assert not marker.exists()
    (evil / ".zarray").unlink()
    with pytest.raises(StoreError, match=r"entry 'evil' is not a zarr format 3 array"):
        open_store(path)
    assert not marker.exists()


def test_a_sharded_array_with_inner_chunks_missing_is_refused_naming_it(tmp_path):
    path = tmp_path / "sharded.zarr"
    group = zarr.open_group(path, mode="w", zarr_format=3)
    array = group.create_array(
        "emb_final",
        shape=(8, 4),
        chunks=(2, 4),
        shards=(8, 4),
        dtype="float32",
        dimension_names=["image", "dim_final"],
    )
    array[:4] = 1.0  # half the inner chunks never written: zarr would read the fill value
    zarr.consolidate_metadata(path)
    with pytest.raises(StoreError, match=r"'emb_final' uses codecs \['sharding_indexed'\]"):
        open_store(path)


def _big_coordinate_store(path: Path) -> Path:
    """A real store of ~100 KB on disk whose int64 dimension coordinate decodes to 1 GiB."""
    n, step = 1 << 27, 1 << 20
    group = zarr.open_group(path, mode="w", zarr_format=3)
    coord = group.create_array(
        "image",
        shape=(n,),
        chunks=(step,),
        dtype="int64",
        fill_value=0,
        dimension_names=["image"],
        compressors=with_checksum(DEFAULT_COMPRESSORS),
        config={"write_empty_chunks": True},
    )
    zeros = np.zeros(step, dtype=np.int64)
    for start in range(0, n, step):
        coord[start : start + step] = zeros
    emb = group.create_array(
        "emb_final", shape=(1,), chunks=(1,), dtype="float32", dimension_names=["one"]
    )
    emb[:] = 1.0
    zarr.consolidate_metadata(path)
    return path


def test_a_1_gib_coordinate_in_a_small_store_is_refused_before_it_is_decoded(tmp_path):
    path = _big_coordinate_store(tmp_path / "big.zarr")
    on_disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    assert on_disk < 2_000_000
    result = _in_subprocess(
        f"""
        from repdiag.core.errors import StoreError
        from repdiag.core.inspect import describe_store
        from repdiag.core.store import open_store
        before = peak_mib()
        result = {{"errors": []}}
        for reader in (open_store, describe_store):
            try:
                reader({str(path)!r})
            except StoreError as err:
                result["errors"].append(str(err))
        result["before_mib"] = before
        """
    )
    assert len(result["errors"]) == 2
    for message in result["errors"]:
        assert "array 'image' decodes to 1073741824 bytes from" in message, message
    assert result["peak_mib"] < 500
    assert result["peak_mib"] - result["before_mib"] < 50  # nothing of the 1 GiB decoded


def test_an_entry_named_into_a_neighbouring_store_is_refused(tmp_path):
    path = _binding(tmp_path / "binding.zarr")
    other = _binding(tmp_path / "other.zarr")
    _set_entry(path, "../other.zarr/correct_index", _entries(other)["correct_index"])
    with pytest.raises(StoreError, match=r"entry '\.\./other\.zarr/correct_index' is not a plain"):
        open_binding_store(path)


def test_a_linked_array_folder_is_refused_naming_it(tmp_path):
    path = _binding(tmp_path / "binding.zarr")
    other = _binding(tmp_path / "other.zarr")
    shutil.rmtree(path / "query_image")
    (path / "query_image").symlink_to(other / "query_image", target_is_directory=True)
    with pytest.raises(StoreError, match=r"query_image is a symbolic link; a store holds no links"):
        open_binding_store(path)
    result = xr.open_zarr(other, zarr_format=3)  # the neighbour itself stays readable
    assert "query_image" in result

"""Store conventions: atomic writes, validated reads, provenance."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import xarray as xr
import zarr

from repdiag.core.errors import StoreError
from repdiag.core.store import atomic_path, open_store, read_json, write_json, write_store


def small_dataset(value: float = 1.0) -> xr.Dataset:
    return xr.Dataset(
        {"emb_final": (("image", "dim_final"), np.full((6, 4), value, dtype=np.float32))},
        coords={"image": np.array([f"query/q{i:05d}" for i in range(6)], dtype=object)},
    )


def test_round_trip_has_named_dimensions_coordinates_and_provenance(tmp_path):
    path = write_store(
        tmp_path / "m.zarr",
        small_dataset(),
        config={"k": 3},
        seed=7,
        encoding={"emb_final": {"chunks": (2, 4)}},
    )
    opened = xr.open_zarr(path)
    assert opened["emb_final"].dims == ("image", "dim_final")
    assert list(opened["image"].values[:2]) == ["query/q00000", "query/q00001"]
    prov = opened.attrs["provenance"]
    assert prov["config"] == {"k": 3} and prov["seed"] == 7
    assert "numpy" in prov["packages"] and prov["repdiag_version"]
    group = zarr.open_group(path, mode="r")
    assert group["emb_final"].metadata.zarr_format == 3
    np.testing.assert_array_equal(open_store(path)["emb_final"].values, 1.0)


def test_zero_valued_chunks_are_written_so_missing_means_damage(tmp_path):
    path = write_store(
        tmp_path / "z.zarr", small_dataset(0.0), encoding={"emb_final": {"chunks": (2, 4)}}
    )
    group = zarr.open_group(path, mode="r")
    assert group["emb_final"].nchunks_initialized == group["emb_final"].nchunks == 3


def test_deleted_chunk_is_an_error_naming_store_and_array(tmp_path):
    path = write_store(
        tmp_path / "d.zarr", small_dataset(), encoding={"emb_final": {"chunks": (2, 4)}}
    )
    chunk = next(
        p for p in (path / "emb_final").rglob("*") if p.is_file() and p.name != "zarr.json"
    )
    chunk.unlink()
    with pytest.raises(StoreError, match=r"d\.zarr.*'emb_final'.*1 of 3 chunks missing"):
        open_store(path)


def test_corrupt_metadata_is_an_error_naming_the_store(tmp_path):
    path = write_store(tmp_path / "c.zarr", small_dataset())
    (path / "zarr.json").write_text("{not json")
    with pytest.raises(StoreError, match=r"c\.zarr"):
        open_store(path)


def test_non_finite_values_are_refused_on_write_and_read(tmp_path):
    bad = small_dataset()
    bad["emb_final"][0, 0] = np.nan
    bad["emb_final"][1, 1] = np.inf
    with pytest.raises(StoreError, match=r"'emb_final' has 2 non-finite"):
        write_store(tmp_path / "bad.zarr", bad)
    assert not (tmp_path / "bad.zarr").exists()
    path = write_store(tmp_path / "ok.zarr", small_dataset())
    array = zarr.open_array(path / "emb_final", mode="r+")
    array[2, 2] = np.nan
    with pytest.raises(StoreError, match=r"'emb_final' has 1 non-finite"):
        open_store(path)


def test_missing_store_and_missing_required_array(tmp_path):
    with pytest.raises(StoreError, match="does not exist: run the workflow rule"):
        open_store(tmp_path / "nope.zarr")
    path = write_store(tmp_path / "m.zarr", small_dataset())
    with pytest.raises(StoreError, match=r"lacks required arrays \['emb_head'\]"):
        open_store(path, required=["emb_head"])


def test_failed_write_keeps_the_previous_store_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "keep.zarr"
    write_store(target, small_dataset(1.0))
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        shutil.copytree(target, tmp)
        raise RuntimeError("killed mid-write")
    np.testing.assert_array_equal(open_store(target)["emb_final"].values, 1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.zarr"]


def test_overwrite_replaces_a_store_whole(tmp_path):
    target = tmp_path / "s.zarr"
    write_store(target, small_dataset(1.0))
    write_store(target, small_dataset(2.0))
    np.testing.assert_array_equal(open_store(target)["emb_final"].values, 2.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]


def test_json_is_atomic_and_refuses_nan(tmp_path):
    path = tmp_path / "m.json"
    write_json(path, {"a": 1})
    with pytest.raises(ValueError):
        write_json(path, {"a": float("nan")})
    assert read_json(path) == {"a": 1}
    path.write_text("{")
    with pytest.raises(StoreError, match="not valid JSON"):
        read_json(path)
    assert json.loads('{"a": 1}') == {"a": 1}


def test_a_write_removes_temporaries_of_killed_writers_and_keeps_the_others(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    from repdiag.core.store import atomic_path

    target = tmp_path / "m.zarr"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    host = socket.gethostname()
    abandoned = tmp_path / f".m.zarr.tmp-{host}-{int(dead.stdout)}-0a1b2c3d"
    live = tmp_path / f".m.zarr.tmp-{host}-{os.getpid()}-0a1b2c3d"
    elsewhere = tmp_path / ".m.zarr.tmp-other-host-1-0a1b2c3d"
    other_store = tmp_path / f".n.zarr.tmp-{host}-{int(dead.stdout)}-0a1b2c3d"
    for folder in (abandoned, live, elsewhere, other_store):
        (folder / "c").mkdir(parents=True)
    with atomic_path(target) as tmp:
        assert tmp.name.startswith(f".m.zarr.tmp-{host}-{os.getpid()}-")
        tmp.mkdir()
    assert target.is_dir() and not abandoned.exists()
    assert live.exists() and elsewhere.exists() and other_store.exists()

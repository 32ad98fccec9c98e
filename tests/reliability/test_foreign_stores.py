"""Stores this workflow did not write (issue "one store reader"): zarr v2 entries, a pickle codec,
sharded arrays, a 1 GiB coordinate in a 100 KB store, entry names that leave the store, linked
arrays, a forged chunk frame with a good checksum, group metadata that is no file or nests deep.
Each is refused by name through the real readers (``open_binding_store``, ``open_store``,
``repdiag inspect``) before any chunk is decoded; resource cases run in a subprocess that
reports its own peak memory."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from repdiag.binding.dataset import BindingSettings, chunk_encoding, render_binding_dataset
from repdiag.binding.store import open_binding_store
from repdiag.core.errors import StoreError
from repdiag.core.inspect import describe_store
from repdiag.core.store import DEFAULT_COMPRESSORS, open_store, with_checksum, write_store
from repdiag.core.store_reader import ZSTD_MAGIC
from tests.reliability.memory import run_measured

REPO = Path(__file__).resolve().parents[2]
SMALL = BindingSettings.from_config(dict(image_size=32, n_queries=4, n_candidates=8, n_pairs=6))
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


def _readers_in_subprocess(path: Path) -> dict:
    """open_store and repdiag inspect on ``path`` in a fresh interpreter: their StoreError
    messages (``errors``), its peak before them (``before_mib``) and at the end (``peak_mib``)."""
    return _in_subprocess(
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
    result = _readers_in_subprocess(path)
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


def rle_bomb(size: int) -> bytes:
    """A valid zstd frame (RFC 8878) that states and decodes to ``size`` zero bytes from 4 bytes
    per 128 KiB: run-length blocks, followed by the CRC32C zarr's crc32c codec appends."""
    import google_crc32c

    block = 1 << 17
    frame = bytearray(struct.pack("<IB", ZSTD_MAGIC, 0xE0) + struct.pack("<Q", size))
    for start in range(0, size, block):
        n = min(block, size - start)
        last = int(start + n >= size)
        frame += (last | (1 << 1) | (n << 3)).to_bytes(3, "little") + b"\0"  # type 1: RLE
    return bytes(frame) + struct.pack("<I", google_crc32c.value(bytes(frame)))


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (1 << 28, "chunk {key} decodes to 268435456 bytes, over the 12288 bytes"),
        (1 << 30, "{key} holds 32785 bytes, over 13408"),  # more than zstd makes of 12288 bytes
    ],
)
def test_a_forged_chunk_with_a_good_checksum_is_refused_unread(tmp_path, size, expected):
    """Issue 60, class 1: metadata untouched, one chunk of query_image replaced by a valid zstd
    frame of run-length blocks (8 KB for 256 MiB, 32 KB for 1 GiB), its checksum correct.
    Before, open_store decoded it (peak in GB) and blamed a checksum; now the file's size and the
    frame's stated size are read first."""
    path = _binding(tmp_path / "binding.zarr")
    chunk = next(p for p in sorted((path / "query_image" / "c").rglob("*")) if p.is_file())
    chunk.write_bytes(rle_bomb(size))
    key = chunk.relative_to(path).as_posix()
    result = _readers_in_subprocess(path)
    assert len(result["errors"]) == 2
    for message in result["errors"]:
        assert expected.format(key=key) in message, message
    assert result["peak_mib"] - result["before_mib"] < 50  # nothing of the frame decoded


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "deep"])
def test_group_metadata_that_is_no_file_or_nests_deep_is_refused_at_once(tmp_path, kind):
    """Issue 60, class 1: the group's zarr.json as a FIFO (a read would wait forever), a link to
    /dev/zero (a read would never end) or JSON nested 100,000 deep (a RecursionError)."""
    path = _binding(tmp_path / "binding.zarr")
    metadata = path / "zarr.json"
    metadata.unlink()
    if kind == "fifo":
        os.mkfifo(metadata)
        expected = "zarr.json is neither a file nor a folder"
    elif kind == "dev_zero":
        metadata.symlink_to("/dev/zero")
        expected = "zarr.json is a symbolic link"
    else:
        metadata.write_bytes(b"[" * 100_000 + b"]" * 100_000)
        expected = "zarr.json (nested too deep)"
    for reader in (open_binding_store, describe_store):
        with pytest.raises(StoreError, match=re.escape(expected)):
            reader(path)

"""The guarded read path of stores: zstd frame sizes against numcodecs' own frames and RFC 8878's
header layout, chunk bounds from the metadata, links and FIFOs refused at the read."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import xarray as xr
import zarr
from numcodecs import Zstd

from repdiag.core.errors import StoreError
from repdiag.core.store import checked_store, open_store, write_store
from repdiag.core.store_reader import (
    MAX_METADATA_BYTES,
    ZSTD_MAGIC,
    chunk_bound,
    parse_metadata,
    read_file,
    zstd_content_size,
)


@pytest.mark.parametrize("size", [0, 1, 255, 256, 300, 65_791, 65_792, 1_000_000])
def test_content_size_is_what_numcodecs_frames_state(size):
    # sizes across the 1-, 2- (offset by 256) and 4-byte fields of a single-segment frame
    frame = Zstd(level=1).encode(np.zeros(size, np.uint8))
    assert zstd_content_size(frame) == size


def header(descriptor: int, window: bytes, dictionary: bytes, size: bytes) -> bytes:
    return struct.pack("<I", ZSTD_MAGIC) + bytes([descriptor]) + window + dictionary + size


def test_content_size_reads_every_header_layout():
    # FCS flag 3 (8 bytes), not single-segment (a window byte), a 4-byte dictionary id
    assert zstd_content_size(header(0xC3, b"\x50", b"\1\2\3\4", struct.pack("<Q", 1 << 40))) == (
        1 << 40
    )
    # FCS flag 1 (2 bytes, +256), single segment, a 1-byte dictionary id
    assert zstd_content_size(header(0x61, b"", b"\7", struct.pack("<H", 10))) == 266
    # FCS flag 0, not single-segment: no size stated
    assert zstd_content_size(header(0x00, b"\x50", b"", b"")) is None
    with pytest.raises(ValueError, match="magic"):
        zstd_content_size(b"\0" * 16)
    with pytest.raises(ValueError, match="reserved"):
        zstd_content_size(header(0x28, b"", b"", b"\0"))
    with pytest.raises(ValueError, match="truncated"):
        zstd_content_size(header(0x80, b"\x50", b"", b"\1"))


def _store(tmp_path):
    ds = xr.Dataset(
        {"x": (("i", "j"), np.arange(48, dtype=np.float32).reshape(6, 8))},
        coords={"name": ("i", [f"item{k}" for k in range(6)])},
    )
    return write_store(tmp_path / "s.zarr", ds, encoding={"x": {"chunks": (3, 8)}})


def test_chunk_bound_is_the_chunk_of_each_array(tmp_path):
    path = _store(tmp_path)
    bounds = checked_store(path).bounds
    assert bounds["x"] == 3 * 8 * 4  # float32 chunk of (3, 8)
    name_entry = zarr.open_array(path / "name", mode="r").metadata.to_dict()
    assert (
        bounds["name"]
        == chunk_bound(name_entry)
        == 6 * name_entry["data_type"]["configuration"]["length_bytes"]
    )
    # every chunk file the writer made states a size within its bound
    for chunk in (path / "x" / "c").rglob("*"):
        if chunk.is_file():
            assert zstd_content_size(chunk.read_bytes()) == bounds["x"]


def test_parse_metadata_refuses_deep_nesting_and_non_objects(tmp_path):
    with pytest.raises(StoreError, match=r"the group has corrupt metadata \S*zarr.json \(nested"):
        parse_metadata(tmp_path, "zarr.json", "the group", b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(StoreError, match="not a JSON object"):
        parse_metadata(tmp_path, "zarr.json", "the group", b"[1]")
    assert parse_metadata(tmp_path, "zarr.json", "the group", b'{"a": [[1]]}') == {"a": [[1]]}


def test_read_file_takes_regular_files_within_the_cap_through_no_link(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"12345")
    assert read_file(tmp_path, "a/f", 5) == b"12345"
    assert read_file(tmp_path, "a/missing", 5) is None
    with pytest.raises(StoreError, match="holds 5 bytes, over 4"):
        read_file(tmp_path, "a/f", 4)
    os.mkfifo(tmp_path / "a" / "fifo")
    with pytest.raises(StoreError, match="not a regular file"):
        read_file(tmp_path, "a/fifo", MAX_METADATA_BYTES)  # refused at once, never waited on
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "a" / "g").symlink_to(tmp_path / "a" / "f")
    for key in ("b/f", "a/g"):  # a linked folder on the way, or a linked file
        with pytest.raises(StoreError, match="symbolic link"):
            read_file(tmp_path, key, 5)
    with pytest.raises(StoreError, match="not a path inside"):
        read_file(tmp_path, "a/../a/f", 5)


def test_a_chunk_swapped_for_a_link_after_the_check_is_refused_at_the_read(tmp_path):
    path = _store(tmp_path)
    other = write_store(
        tmp_path / "o.zarr",
        xr.Dataset({"x": (("i", "j"), np.ones((6, 8), np.float32))}),
        encoding={"x": {"chunks": (3, 8)}},
    )
    store = checked_store(path)  # the tree is clean when it is checked
    chunk = path / "x" / "c" / "0" / "0"
    chunk.unlink()
    chunk.symlink_to(other / "x" / "c" / "0" / "0")  # then a chunk is swapped
    with pytest.raises(StoreError, match=r"x/c/0/0 is reached through a symbolic link"):
        open_store(path, checked=store)


def test_a_chunk_that_declares_more_than_its_array_holds_is_refused(tmp_path):
    path = _store(tmp_path)
    chunk = path / "x" / "c" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    descriptor = data[4]
    assert descriptor & 0x20 and descriptor >> 6 == 0  # numcodecs: single segment, 1-byte size
    data[5] = 97  # claims 97 bytes, over the chunk's 96
    chunk.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"chunk x/c/0/0 decodes to 97 bytes, over the 96"):
        open_store(path)


def test_a_chunk_whose_frame_states_no_size_is_refused(tmp_path):
    """The smallest hostile chunk: a 6-byte zstd header that states no content size (a
    streaming frame, which numcodecs would decode to whatever it holds)."""
    path = _store(tmp_path)
    (path / "x" / "c" / "0" / "0").write_bytes(header(0x00, b"\x50", b"", b""))
    with pytest.raises(StoreError, match=r"chunk x/c/0/0 is a zstd frame that does not state"):
        open_store(path)
    (path / "x" / "c" / "0" / "0").write_bytes(b"")  # an empty chunk file: not a frame
    with pytest.raises(StoreError, match=r"chunk x/c/0/0 is not zstd-compressed"):
        open_store(path)

"""The one path by which a store's files are read, after :mod:`repdiag.core.store_preflight`.

:class:`GuardedStore` is a read-only zarr ``LocalStore`` whose every read

- walks the key one component at a time from a descriptor of the store's folder, each component
  opened with ``O_NOFOLLOW`` (``openat``): a component swapped for a symbolic link after the
  tree check is refused at the read, not followed;
- takes a regular file only (``O_NONBLOCK``: a FIFO is refused at once, never waited on), of at
  most :data:`MAX_METADATA_BYTES` for metadata and, for a chunk, what zstd may make of the bytes
  its array's chunk holds (:func:`stored_limit`), read to that cap and no further;
- for a chunk of a zstd-compressed array, reads the frame's declared content size
  (:func:`zstd_content_size`, RFC 8878 section 3.1.1.1) and refuses a frame that declares none or
  more than the array's chunk holds (:func:`chunk_bound`). numcodecs decompresses a frame that
  states its size into a buffer of exactly that size and fails past it, so what a chunk decodes
  to is bounded where it is decoded, whatever the metadata or a forged checksum says.

Metadata is parsed by :func:`parse_metadata`: a JSON object; nesting past the recursion limit
is refused as corrupt metadata.
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.storage import LocalStore

from repdiag.core.store_preflight import damaged

MAX_METADATA_BYTES = 64 << 20
"""Bytes of one ``zarr.json`` (64 MiB): the consolidated metadata of the largest store is ~1 MB."""
MAX_CHUNK_FILE_BYTES = (1 << 31) + 64
"""Bytes of one chunk file: a chunk decodes to at most 2 GiB (store_preflight.MAX_CHUNK_BYTES),
and zstd stores incompressible data in raw blocks with a few bytes of framing."""
VLEN_ITEM_BYTES = 1 << 16
"""Bytes one element of a variable-length string array may encode to (64 KiB) before a chunk is
refused: such arrays hold names and paths here."""
ZSTD_MAGIC = 0xFD2FB528


def zstd_content_size(frame: bytes | memoryview) -> int | None:
    """The ``Frame_Content_Size`` of the zstd frame at the start of ``frame``, or None when its
    header does not state one (RFC 8878, 3.1.1.1: magic, descriptor, window descriptor unless
    single-segment, dictionary id of 0/1/2/4 bytes, then the size in 0/1/2/4/8 bytes, the 2-byte
    form offset by 256). Raises ValueError for bytes that are not a zstd frame header."""
    if len(frame) < 5 or int.from_bytes(frame[:4], "little") != ZSTD_MAGIC:
        raise ValueError("not a zstd frame (magic number)")
    descriptor = frame[4]
    if descriptor & 0x08:
        raise ValueError("a zstd frame header with its reserved bit set")
    single_segment = (descriptor >> 5) & 1
    size_field = (single_segment, 2, 4, 8)[descriptor >> 6]
    start = 5 + (1 - single_segment) + (0, 1, 2, 4)[descriptor & 0x03]
    if size_field == 0:
        return None
    if len(frame) < start + size_field:
        raise ValueError("a truncated zstd frame header")
    value = int.from_bytes(frame[start : start + size_field], "little")
    return value + 256 if size_field == 2 else value


def chunk_bound(entry: Mapping[str, Any]) -> int | None:
    """Bytes one chunk of the consolidated ``entry`` decodes to through zstd (the array-to-bytes
    codec's output): chunk elements x item size, or x (4 + :data:`VLEN_ITEM_BYTES`) + 4 for a
    variable-length string array. None when the array is not zstd-compressed."""
    codecs = [c.get("name") if isinstance(c, dict) else c for c in entry.get("codecs") or []]
    if "zstd" not in codecs:
        return None
    chunk = entry["chunk_grid"]["configuration"]["chunk_shape"]
    elements = math.prod(chunk)
    data_type = entry.get("data_type")
    name = data_type.get("name") if isinstance(data_type, dict) else data_type
    if name == "string" or "vlen-utf8" in codecs or "vlen-bytes" in codecs:
        return 4 + elements * (4 + VLEN_ITEM_BYTES)
    if name == "fixed_length_utf32":
        return elements * int(data_type["configuration"]["length_bytes"])
    return elements * np.dtype(name).itemsize


def parse_metadata(path: Path, key: str, what: str, raw: bytes) -> dict[str, Any]:
    """``raw``, the file ``key`` of the store at ``path``, as a JSON object, else a StoreError
    naming ``what`` and the file. Nesting deeper than the interpreter's recursion limit (about
    1000 levels) is refused as corrupt, not a traceback."""
    try:
        metadata = json.loads(raw)
    except (ValueError, RecursionError) as err:  # JSON, Unicode and nesting errors
        reason = "nested too deep" if isinstance(err, RecursionError) else str(err)
        raise damaged(path, f"{what} has corrupt metadata {path / key} ({reason})") from None
    if not isinstance(metadata, dict):
        raise damaged(path, f"{what} has corrupt metadata {path / key} (not a JSON object)")
    return metadata


def read_file(root: Path, key: str, limit: int) -> bytes | None:
    """The bytes of ``root/key``, each component opened with ``O_NOFOLLOW`` from a descriptor of
    ``root``, a regular file of at most ``limit`` bytes; None when it does not exist."""
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise damaged(root, f"key {key!r} is not a path inside the store")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptors: list[int] = []
    try:
        descriptors.append(os.open(root, flags | os.O_DIRECTORY))
        for part in parts[:-1]:
            descriptors.append(os.open(part, flags | os.O_DIRECTORY, dir_fd=descriptors[-1]))
        descriptors.append(os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=descriptors[-1]))
        info = os.fstat(descriptors[-1])
        if not stat.S_ISREG(info.st_mode):
            raise damaged(root, f"{key} is not a regular file")
        if info.st_size > limit:
            raise damaged(root, f"{key} holds {info.st_size} bytes, over {limit}")
        with os.fdopen(descriptors.pop(), "rb") as file:
            data = file.read(info.st_size + 1)  # a buffer of its size, not of the cap
        if len(data) > info.st_size:
            raise damaged(root, f"{key} grew while it was read; nothing writes a finished store")
        return data
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):  # a component is a link, or not a folder
            raise damaged(
                root, f"{key} is reached through a symbolic link or a file; a store holds no links"
            ) from None
        raise
    finally:
        for descriptor in descriptors:
            os.close(descriptor)


class GuardedStore(LocalStore):
    """A read-only LocalStore of a checked store (module docstring). ``bounds``: array name ->
    :func:`chunk_bound` of its consolidated entry; a chunk of an array absent from it is read
    with no frame check only when the array is not zstd-compressed (bound None)."""

    def __init__(self, root: Path, bounds: Mapping[str, int | None]) -> None:
        super().__init__(root, read_only=True)
        self.bounds = dict(bounds)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GuardedStore) and (self.root, self.bounds) == (
            other.root,
            other.bounds,
        )

    __hash__ = None  # type: ignore[assignment]

    def read(self, key: str) -> bytes | None:
        """The bytes of ``key`` through the guards of the module docstring."""
        name, _, rest = key.partition("/")
        if not rest.startswith("c/"):
            return read_file(self.root, key, MAX_METADATA_BYTES)
        if name not in self.bounds:
            raise damaged(
                self.root, f"chunk {key} belongs to no array of the consolidated metadata"
            )
        bound = self.bounds[name]
        data = read_file(
            self.root, key, MAX_CHUNK_FILE_BYTES if bound is None else stored_limit(bound)
        )
        if data is not None and bound is not None:
            check_frame(self.root, key, data, bound)
        return data

    async def get(
        self, key: str, prototype: BufferPrototype | None = None, byte_range: Any = None
    ) -> Buffer | None:
        if byte_range is not None:  # this workflow's arrays are read whole (no sharding)
            raise damaged(self.root, f"a partial read of {key} was asked; no array here needs one")
        data = await asyncio.to_thread(self.read, key)
        if data is None:
            return None
        return (prototype or default_buffer_prototype()).buffer.from_bytes(data)

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]


def stored_limit(bound: int) -> int:
    """Bytes a chunk file that decodes to ``bound`` bytes may hold: zstd's worst case
    (``ZSTD_COMPRESSBOUND``: n + n/256 + framing) and the 4-byte checksum, with room to spare."""
    return bound + (bound >> 7) + 1024


def check_frame(root: Path, key: str, data: bytes, bound: int) -> None:
    """The zstd frame at the start of chunk ``key`` states a content size of at most ``bound``."""
    try:
        size = zstd_content_size(data)
    except ValueError as err:
        raise damaged(
            root, f"chunk {key} is not zstd-compressed as its array says ({err})"
        ) from None
    if size is None:
        raise damaged(
            root,
            f"chunk {key} is a zstd frame that does not state its size; this workflow's writer "
            "always states it, and a frame without one could decode to any size",
        )
    if size > bound:
        raise damaged(
            root,
            f"chunk {key} decodes to {size} bytes, over the {bound} bytes a chunk of its array "
            "holds (a forged frame: its checksum proves nothing)",
        )

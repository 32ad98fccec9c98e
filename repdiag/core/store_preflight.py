"""What a store must be before any of it is decoded: only what :func:`repdiag.core.store.write_store`
writes, nothing else.

Checked on the files and the metadata alone (no chunk is decoded here):

- **the tree**: no symbolic link anywhere (the store itself included), nothing but folders and
  regular files, and no zarr v2 file (``.zarray``, ``.zgroup``, ``.zattrs``, ``.zmetadata``) at
  any depth;
- **each consolidated entry**: its name is one path component (no ``/``, no ``..``); it is a zarr
  format 3 array (``node_type: array``; a v2 entry has none, a nested group is not written here)
  with a regular chunk grid, the default chunk key encoding, no storage transformer, a data type
  of :data:`DATA_TYPES` and codecs of :data:`CODECS` only (no sharding, no pickle, no blosc);
- **sizes**: the chunks and bytes each array declares (:data:`MAX_CHUNKS`,
  :data:`MAX_ARRAY_BYTES`, :data:`MAX_CHUNK_BYTES`), and the bytes all arrays would decode to,
  coordinates included, per array and per store, at most :func:`decode_ratio` times the bytes
  on disk (or :data:`DECODE_FLOOR`, for small stores) and at most :data:`MAX_STORE_BYTES`.

Each failure is a :class:`StoreError` naming the store, the entry and what to do.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from repdiag.core.errors import StoreError

CODECS = frozenset({"bytes", "vlen-utf8", "vlen-bytes", "zstd", "crc32c"})
"""The codecs :func:`repdiag.core.store.write_store` writes (zarr's defaults plus the checksum)."""
DATA_TYPES = frozenset(
    {
        "bool",
        *(f"{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)),
        "float16",
        "float32",
        "float64",
        "string",
        "fixed_length_utf32",
    }
)
V2_FILES = frozenset({".zarray", ".zgroup", ".zattrs", ".zmetadata"})
STRING_ITEM_BYTES = 64
"""Decoded bytes counted per element of a variable-length string array (a Python str)."""

MAX_CHUNKS = 1 << 20
"""Chunks per array a store may declare: counting its chunk files must stay a matter of seconds."""
MAX_ARRAY_BYTES = 1 << 40
"""Bytes per array a store may declare (1 TiB): more is a crafted or corrupt shape."""
MAX_CHUNK_BYTES = 1 << 31
"""Decoded bytes per chunk a store may declare (2 GiB): zarr decodes whole chunks."""
MAX_STORE_BYTES = 1 << 36
"""Decoded bytes of all the arrays of one store (64 GiB): readers load a store into memory."""
DECODE_RATIO = 1000
"""Decoded bytes per byte on disk, per array and per store; ``REPDIAG_STORE_DECODE_RATIO``."""
DECODE_FLOOR = 1 << 28
"""Decoded bytes always allowed (256 MiB), whatever the ratio: small stores of constants."""


def damaged(path: Path, what: str) -> StoreError:
    """The error for a store that is not what this workflow writes."""
    return StoreError(
        f"store {path}: {what}; the store is partial or damaged: delete it and rerun the rule "
        "that produces it"
    )


def decode_ratio() -> int:
    """``$REPDIAG_STORE_DECODE_RATIO`` when set, else :data:`DECODE_RATIO`."""
    value = os.environ.get("REPDIAG_STORE_DECODE_RATIO", str(DECODE_RATIO))
    try:
        ratio = int(value)
    except ValueError:
        ratio = 0
    if ratio < 1:
        raise StoreError(f"REPDIAG_STORE_DECODE_RATIO={value!r} must be a positive integer")
    return ratio


def stored_bytes(info: os.stat_result) -> int:
    """Bytes a file really holds: its size, or its allocated blocks when fewer (a sparse file's
    holes hold nothing, and would otherwise lift the decode ratio)."""
    return min(info.st_size, info.st_blocks * 512)


def disk_bytes(path: Path) -> dict[str, int]:
    """Bytes of chunk files on disk per array of the store at ``path`` (:func:`stored_bytes`):
    what the decode ratio is taken on. Metadata and stray files count for nothing.

    Refuses a symbolic link anywhere (the store included), anything but folders and regular
    files, and zarr v2 files, naming the entry.
    """
    if path.is_symlink():
        raise damaged(path, f"it is a symbolic link (to {os.readlink(path)}); a store is a folder")
    sizes: dict[str, int] = {}
    for top, dirs, files in os.walk(path, followlinks=False):
        for name in (*dirs, *files):
            entry = Path(top) / name
            relative = entry.relative_to(path).as_posix()
            mode = os.lstat(entry).st_mode
            if stat.S_ISLNK(mode):
                raise damaged(
                    path,
                    f"{relative} is a symbolic link; a store holds no links: nothing is read "
                    "through one",
                )
            if name in V2_FILES:
                raise damaged(
                    path,
                    f"{relative} is a zarr format 2 entry; this workflow writes and reads "
                    "zarr format 3 only",
                )
            if stat.S_ISREG(mode):
                key, _, inside = relative.partition("/")
                if inside.startswith("c/"):  # a chunk: only chunks hold what is decoded
                    sizes[key] = sizes.get(key, 0) + stored_bytes(os.lstat(entry))
            elif not stat.S_ISDIR(mode):
                raise damaged(path, f"{relative} is neither a file nor a folder")
    return sizes


def check_name(path: Path, name: Any) -> None:
    """An entry name is one plain path component: no ``/``, ``\\``, NUL, nor ``..``."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or ".." in name
        or any(c in name for c in "/\\\0")
    ):
        raise damaged(
            path, f"entry {name!r} is not a plain array name (one path component, no '..')"
        )


def _type_name(data_type: Any) -> str | None:
    if isinstance(data_type, dict):
        data_type = data_type.get("name")
    return data_type if isinstance(data_type, str) else None


def check_entry(path: Path, name: str, entry: dict) -> None:
    """The consolidated entry ``name`` is a zarr v3 array as this workflow writes it."""
    what = f"entry {name!r}"
    if entry.get("zarr_format") != 3 or entry.get("node_type") != "array":
        raise damaged(
            path,
            f"{what} is not a zarr format 3 array (zarr_format {entry.get('zarr_format')!r}, "
            f"node_type {entry.get('node_type')!r}); this workflow writes one group of zarr v3 "
            "arrays and reads nothing else",
        )
    codecs = entry.get("codecs")
    names = [c.get("name") if isinstance(c, dict) else c for c in codecs or []]
    foreign = [n for n in names if n not in CODECS]
    if not names or foreign:
        raise damaged(
            path,
            f"array {name!r} uses codecs {foreign or names}; this workflow writes only "
            f"{sorted(CODECS)} (no sharding, no pickle)",
        )
    grid = (entry.get("chunk_grid") or {}).get("name")
    keys = entry.get("chunk_key_encoding") or {}
    layout = (grid, keys.get("name"), (keys.get("configuration") or {}).get("separator", "/"))
    if layout != ("regular", "default", "/") or entry.get("storage_transformers"):
        raise damaged(
            path,
            f"array {name!r} has chunk grid {grid!r}, chunk keys {keys!r} and storage "
            f"transformers {entry.get('storage_transformers')!r}; this workflow writes a regular "
            "grid, default '/' keys and no transformer",
        )
    if _type_name(entry.get("data_type")) not in DATA_TYPES:
        raise damaged(path, f"array {name!r} has data type {entry.get('data_type')!r}")


def _itemsize(data_type: Any) -> int:
    name = _type_name(data_type)
    if name == "string":
        return STRING_ITEM_BYTES
    if name == "fixed_length_utf32" and isinstance(data_type, dict):
        size = (data_type.get("configuration") or {}).get("length_bytes")
        return size if isinstance(size, int) and size > 0 else 1
    try:
        return max(np.dtype(name).itemsize, 1) if name else 1
    except TypeError:
        return 1


def declared_sizes(entry: dict) -> tuple[int, int, int] | None:
    """(bytes of the array, chunks, bytes of one decoded chunk) from an array's metadata, in
    Python integers (no overflow); None when the metadata does not state them plainly."""
    shape = entry.get("shape")
    grid = (entry.get("chunk_grid") or {}).get("configuration") or {}
    chunk = grid.get("chunk_shape")
    if not (isinstance(shape, list) and isinstance(chunk, list) and len(shape) == len(chunk)):
        return None
    if not all(isinstance(n, int) and n >= 0 for n in shape) or not all(
        isinstance(n, int) and n > 0 for n in chunk
    ):
        return None
    itemsize = _itemsize(entry.get("data_type"))
    chunks = math.prod(-(-n // c) for n, c in zip(shape, chunk, strict=True))
    return math.prod(shape) * itemsize, chunks, math.prod(chunk) * itemsize


def check_declared_sizes(path: Path, name: str, entry: dict) -> int:
    """Refuse an array whose metadata declares more chunks or bytes than any store of this
    workflow holds (:data:`MAX_CHUNKS`, :data:`MAX_ARRAY_BYTES`, :data:`MAX_CHUNK_BYTES`), before
    zarr counts its chunks or decodes one. Returns the bytes it decodes to (0 if unstated)."""
    sizes = declared_sizes(entry)
    if sizes is None:
        return 0  # zarr's own parse reports malformed metadata
    total, chunks, chunk_bytes = sizes
    for value, limit, what in (
        (chunks, MAX_CHUNKS, "chunks"),
        (total, MAX_ARRAY_BYTES, "bytes"),
        (chunk_bytes, MAX_CHUNK_BYTES, "bytes per decoded chunk"),
    ):
        if value > limit:
            raise damaged(
                path,
                f"array {name!r} declares {value} {what} (shape {entry.get('shape')}, chunks "
                f"{entry['chunk_grid']['configuration']['chunk_shape']}); the limit is {limit}",
            )
    return total


def check_decoded_bytes(path: Path, decoded: dict[str, int], on_disk: dict[str, int]) -> None:
    """Each array, and the store, decodes to at most :func:`decode_ratio` times its bytes on disk
    (or :data:`DECODE_FLOOR`) and the store to at most :data:`MAX_STORE_BYTES`."""
    ratio = decode_ratio()
    hint = (
        "a store of this workflow compresses less; if this one was written here, raise "
        "REPDIAG_STORE_DECODE_RATIO"
    )
    for name, size in decoded.items():
        allowed = max(DECODE_FLOOR, ratio * on_disk.get(name, 0))
        if size > allowed:
            raise damaged(
                path,
                f"array {name!r} decodes to {size} bytes from {on_disk.get(name, 0)} on disk, "
                f"over {allowed} ({ratio} times, at least {DECODE_FLOOR}); {hint}",
            )
    total, stored = sum(decoded.values()), sum(on_disk.values())
    allowed = min(max(DECODE_FLOOR, ratio * stored), MAX_STORE_BYTES)
    if total > allowed:
        raise damaged(
            path,
            f"its arrays decode to {total} bytes from {stored} on disk, over {allowed} "
            f"({ratio} times, at least {DECODE_FLOOR}, at most {MAX_STORE_BYTES}); {hint}",
        )

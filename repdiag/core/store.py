"""Zarr conventions shared by every stage.

A store is zarr format 3, one group, every array with ``dimension_names`` and coordinate arrays for
labelled dimensions, so ``xarray.open_zarr(path)`` returns a labelled Dataset with no extra
arguments. Group attrs hold provenance. Every chunk ends with a CRC32C checksum (zarr's ``crc32c``
codec, after the default zstd compression), so a flipped or missing byte fails the read instead of
decoding to wrong numbers. Writes go to a temporary sibling (``.<name>.tmp-<host>-<pid>-<hex>``) and are renamed
into place only when complete; reads check the metadata of every array against the consolidated
metadata, that every chunk was written, that every chunk matches its checksum and that every
float is finite, and name the store and the array when one of these fails. Small files (JSON,
CSV, text, figures, checkpoints) go through :func:`atomic_path` for the same guarantee.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import glob
import importlib.metadata
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from repdiag.core.errors import StoreError
from repdiag.core.store_preflight import (
    check_declared_sizes,
    check_decoded_bytes,
    check_entry,
    check_name,
    disk_bytes,
)
from repdiag.core.store_preflight import damaged as _damaged
from repdiag.core.store_reader import (
    MAX_METADATA_BYTES,
    GuardedStore,
    chunk_bound,
    parse_metadata,
    read_file,
)
from repdiag.core.version import __version__

log = logging.getLogger(__name__)

PROVENANCE_PACKAGES = ("numpy", "torch", "timm", "open_clip_torch", "zarr", "xarray", "scipy")


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def package_versions(names: Iterable[str] = PROVENANCE_PACKAGES) -> dict[str, str]:
    """Installed versions of ``names`` (absent packages are skipped)."""
    return dict(_versions(tuple(names)))


@functools.lru_cache(maxsize=8)
def _versions(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    # Read once per process: the versions of the modules a process has imported cannot change
    # under it, and the metadata lookups cost ~10 ms per store.
    versions = []
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append((name, importlib.metadata.version(name)))
    return tuple(versions)


def _torch_numerics() -> dict[str, Any] | None:
    """torch's TF32 and determinism switches at write time (:func:`repdiag.core.gpu.numerics_record`),
    or None in a process that never imported torch (nothing it wrote came from torch)."""
    if "torch" not in sys.modules:
        return None
    from repdiag.core.gpu import numerics_record

    return numerics_record()


def provenance(config: Mapping[str, Any] | None = None, seed: int | None = None) -> dict[str, Any]:
    """Attrs recording what produced a store: version, config subset, seed, time, packages, commit,
    and torch's numerical switches (``numerics``: TF32, deterministic algorithms)."""
    return {
        "repdiag_version": __version__,
        "config": json.loads(json.dumps(dict(config or {}), default=str)),
        "seed": seed,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "packages": package_versions(),
        "git_commit": _git_commit(),
        "numerics": _torch_numerics(),
    }


def _temporary_sibling(target: Path) -> Path:
    """``.<name>.tmp-<host>-<pid>-<hex>``: the writer's host and process name it, so that a
    later writer can tell an abandoned one (:func:`_remove_abandoned`)."""
    writer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return target.with_name(f".{target.name}.tmp-{writer}")


def _remove_abandoned(target: Path) -> None:
    """Delete the temporaries of ``target`` left by killed writers: those of this host whose
    process is gone. Another host's, or a live process's, are never touched."""
    host = socket.gethostname()
    for sibling in target.parent.glob(f".{glob.escape(target.name)}.tmp-*"):
        writer = sibling.name.removeprefix(f".{target.name}.tmp-").rsplit("-", 2)
        if len(writer) != 3 or writer[0] != host or not writer[1].isdigit():
            continue  # another host's, or the old <hex>-only name: left alone
        try:
            os.kill(int(writer[1]), 0)
        except ProcessLookupError:
            log.info("removing %s, left by a killed writer of %s", sibling, target)
            shutil.rmtree(sibling, ignore_errors=True) if sibling.is_dir() else sibling.unlink()
        except PermissionError:  # a live process of another user
            continue


def _replace(tmp: Path, target: Path) -> None:
    """Move ``tmp`` onto ``target``; an old ``target`` survives until the new one is in place."""
    if target.is_dir() and not target.is_symlink():
        # A directory cannot be renamed onto a non-empty one: move the old one aside first, and
        # back if the second rename fails. A writer killed between the two renames leaves the old
        # store as the hidden ``.<name>.old-<hex>`` and no ``target``.
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(target, old)
        try:
            os.replace(tmp, target)
        except BaseException:
            os.replace(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it onto ``target`` only if the block succeeds.

    Works for files and directories (zarr stores). On error the temporary path is removed and an
    existing ``target`` is left untouched. A writer killed outright leaves its temporary, a hidden
    ``.<name>.tmp-<host>-<pid>-<hex>`` beside ``target``: no reader opens it (readers open
    ``target`` by its name), and the next write of ``target`` on that host deletes it once its
    process is gone.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(target)
    tmp = _temporary_sibling(target)
    try:
        yield tmp
        if not tmp.exists():
            raise StoreError(f"nothing was written to {tmp} for {target}")
        _replace(tmp, target)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as indented JSON, atomically. NaN/inf are refused (not valid JSON)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n")


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def read_json(path: str | os.PathLike[str]) -> Any:
    path = Path(path)
    if not path.is_file():
        raise StoreError(f"{path} does not exist: run the workflow rule that produces it")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise StoreError(f"{path} is not valid JSON ({err}); delete it and rerun its rule") from err


DEFAULT_COMPRESSORS = (ZstdCodec(),)  # zarr's default for format 3


def with_checksum(compressors: Any) -> tuple[Any, ...]:
    """``compressors`` (a codec, a sequence of them, or None) followed by one :class:`Crc32cCodec`.

    The checksum is the last bytes-to-bytes codec, so it covers the bytes as stored: any change
    to a chunk file, truncation included, fails the read with a checksum mismatch.
    """
    if compressors is None:
        codecs: tuple[Any, ...] = ()
    elif isinstance(compressors, list | tuple):
        codecs = tuple(compressors)
    else:
        codecs = (compressors,)
    codecs = tuple(c for c in codecs if not isinstance(c, Crc32cCodec))
    return (*codecs, Crc32cCodec())


def check_finite(name: str, values: np.ndarray, where: str) -> None:
    """Raise :class:`StoreError` naming ``name`` and the count when ``values`` has NaN or inf."""
    if values.dtype.kind in "fc":
        bad = int(values.size - np.count_nonzero(np.isfinite(values)))
        if bad:
            raise StoreError(
                f"{where}: array {name!r} has {bad} non-finite (NaN or infinite) values of "
                f"{values.size}; the producing stage diverged or the input is corrupt"
            )


def write_store(
    path: str | os.PathLike[str],
    ds: xr.Dataset,
    *,
    config: Mapping[str, Any] | None = None,
    seed: int | None = None,
    encoding: Mapping[str, Any] | None = None,
) -> Path:
    """Validate ``ds`` and write it as a zarr v3 store at ``path`` atomically, with provenance.

    Every chunk is written (``write_empty_chunks``) so that a missing chunk on read means damage,
    never a legitimately empty region, and ends with a CRC32C checksum (:func:`with_checksum`) so
    that a changed byte means damage too. ``encoding`` is xarray's per-variable encoding (e.g.
    ``{"x": {"chunks": (64, 16)}}``); its ``compressors`` get the checksum appended.
    """
    path = Path(path)
    for name, var in ds.variables.items():
        check_finite(str(name), np.asarray(var.values), f"refusing to write {path}")
    ds = ds.copy()
    ds.attrs = {**ds.attrs, "provenance": provenance(config, seed)}
    encoding = {name: dict(enc) for name, enc in (encoding or {}).items()}
    for name, var in ds.variables.items():
        if name in encoding:  # replaces the variable's own encoding in xarray
            enc = encoding[name]
            enc["compressors"] = with_checksum(enc.get("compressors", DEFAULT_COMPRESSORS))
        else:
            var.encoding = {
                **var.encoding,
                "compressors": with_checksum(var.encoding.get("compressors", DEFAULT_COMPRESSORS)),
            }
    with atomic_path(path) as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        # Coordinates are fixed-width unicode, which zarr-python reads back exactly but flags on
        # every write as not yet in the v3 spec: one line per array in every job log otherwise.
        warnings.filterwarnings("ignore", category=zarr.errors.UnstableSpecificationWarning)
        ds.to_zarr(
            tmp,
            mode="w",
            zarr_format=3,
            consolidated=True,
            write_empty_chunks=True,
            encoding=encoding,
        )
    return path


def _read_metadata(path: Path, key: str, what: str) -> dict[str, Any]:
    raw = read_file(path, key, MAX_METADATA_BYTES)
    if raw is None:
        raise _damaged(path, f"{what} has no metadata file {Path(key).name}")
    return parse_metadata(path, key, what, raw)


def store_arrays(path: str | os.PathLike[str]) -> list[str]:
    """Names of the arrays of the store at ``path``, after checking its files, metadata and chunks
    (:func:`checked_store`)."""
    return list(checked_store(path).bounds)


def checked_store(path: str | os.PathLike[str]) -> GuardedStore:
    """The store at ``path`` as a :class:`~repdiag.core.store_reader.GuardedStore`, after checking
    its files, metadata and chunks; its ``bounds`` name its arrays.

    The store must be what :func:`write_store` writes and nothing else
    (:mod:`repdiag.core.store_preflight`: no link, no zarr v2 file, only zarr v3 arrays with this
    workflow's codecs and chunk layout, plain names, decoded sizes bounded by the bytes on disk),
    checked on the tree before any file is read. The group's ``zarr.json`` must be zarr format 3
    with consolidated metadata; every array it lists must have a ``zarr.json`` identical to its
    consolidated entry, that zarr can parse, and every chunk written. Raises :class:`StoreError`
    naming the store and the array otherwise. Chunk contents are not read here (:func:`open_store`
    does, through the returned store: links refused at the read, each chunk's decoded size
    bounded by its array's chunk, checksums).
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        left = sorted(path.parent.glob(f".{glob.escape(path.name)}.old-*"))
        hint = (
            f" (a writer killed while replacing it left the previous version at {left[-1]})"
            if left
            else ""
        )
        raise StoreError(
            f"store {path} does not exist{hint}: run the workflow rule that produces it"
        )
    if not path.is_dir() and not path.is_symlink():
        raise _damaged(path, "it is not a directory (a zarr store is one)")
    on_disk = disk_bytes(path)  # the tree first: no link, FIFO or device is ever opened
    group = _read_metadata(path, "zarr.json", "the group")
    if group.get("zarr_format") != 3 or group.get("node_type") != "group":
        raise _damaged(
            path,
            f"{path / 'zarr.json'} is not the metadata of a zarr format 3 group "
            f"(zarr_format {group.get('zarr_format')!r}, node_type {group.get('node_type')!r})",
        )
    consolidated = group.get("consolidated_metadata")
    entries = consolidated.get("metadata") if isinstance(consolidated, dict) else None
    if not isinstance(entries, dict):
        raise _damaged(path, f"{path / 'zarr.json'} has no consolidated metadata")
    decoded = {}
    for name, entry in entries.items():
        check_name(path, name)
        if not isinstance(entry, dict):
            raise _damaged(path, f"array {name!r} has a corrupt consolidated metadata entry")
        check_entry(path, name, entry)
        what = f"array {name!r}"
        if _read_metadata(path, f"{name}/zarr.json", what) != entry:
            raise _damaged(
                path,
                f"{what}: {path / name / 'zarr.json'} disagrees with the consolidated metadata "
                f"in {path / 'zarr.json'}",
            )
        decoded[name] = check_declared_sizes(path, name, entry)
    check_decoded_bytes(path, decoded, on_disk)
    store = GuardedStore(path, {name: chunk_bound(entry) for name, entry in entries.items()})
    for name in entries:
        what = f"array {name!r}"
        try:
            array = zarr.open_array(store, path=name, mode="r", zarr_format=3)
            written, expected = array.nchunks_initialized, array.nchunks
        except StoreError:
            raise
        except Exception as err:  # zarr raises many types for invalid metadata
            raise _damaged(
                path, f"{what} has invalid metadata ({type(err).__name__}: {err})"
            ) from err
        if written != expected:
            raise _damaged(
                path, f"array {name!r} has {expected - written} of {expected} chunks missing"
            )
        if not any(isinstance(codec, Crc32cCodec) for codec in array.compressors):
            log.debug("store %s: array %r has no checksum (written before checksums)", path, name)
    return store


def _unreadable(store: GuardedStore, names: Iterable[str], err: Exception) -> StoreError:
    """The error for a store that failed to load: read array by array to name the damaged ones."""
    path = Path(store.root)
    bad = {}
    for name in names:
        try:
            zarr.open_array(store, path=name, mode="r", zarr_format=3)[...]
        except StoreError as guard:  # the reader's own refusal says what is wrong
            return guard
        except Exception as array_err:  # checksum mismatch (ValueError), codec errors, ...
            bad[name] = f"{type(array_err).__name__}: {array_err}"
    if not bad:
        return StoreError(
            f"store {path} cannot be read ({type(err).__name__}: {err}); "
            "delete it and rerun the rule that produces it"
        )
    details = "; ".join(f"array {name!r}: {reason}" for name, reason in bad.items())
    return _damaged(path, f"a chunk is corrupt (checksum mismatch or truncated) in {details}")


def open_store(
    path: str | os.PathLike[str],
    *,
    required: Iterable[str] = (),
    check_values: bool = True,
    variables: Iterable[str] | None = None,
    contract: Mapping[str, tuple[str, tuple[str, ...]]] | None = None,
    checked: GuardedStore | None = None,
) -> xr.Dataset:
    """Open a store written by :func:`write_store`, fully validated, loaded into memory.

    Fails with a :class:`StoreError` naming the store (and the array, where one is at fault) when
    it is missing, not zarr v3, has corrupt metadata, lacks a ``required`` variable, has unwritten
    chunks or a chunk whose checksum does not match, or holds NaN/inf. With ``variables``, only
    those variables (and their coordinates) are loaded; metadata and chunk completeness are
    checked for every array all the same. ``contract`` maps array names to the dtype and dims
    ``docs/contracts.md`` gives them; an array present with another dtype or dims is an error.
    ``checked``: the :func:`checked_store` of ``path`` already made by the caller.
    """
    path = Path(path)
    store = checked or checked_store(path)
    names = list(store.bounds)
    required = list(required)
    selected = None if variables is None else list(variables)
    missing = [name for name in [*required, *(selected or [])] if name not in names]
    if missing:
        raise StoreError(
            f"store {path} lacks required arrays {list(dict.fromkeys(missing))}; "
            "it was made by another version"
        )
    suspects = names
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning)
            ds = xr.open_zarr(store, zarr_format=3, consolidated=True)
            if selected is not None:
                ds = ds[selected]
                suspects = [str(name) for name in ds.variables]
            ds = ds.load()
    except StoreError:  # the guarded reader's refusal (a link, a forged frame)
        raise
    except Exception as err:  # zarr/xarray raise many types for corrupt chunks
        raise _unreadable(store, suspects, err) from err
    check_contract(ds, contract or {}, f"store {path}")
    if check_values:
        for name, var in ds.variables.items():
            check_finite(str(name), np.asarray(var.values), f"store {path}")
    return ds


def check_contract(
    ds: xr.Dataset, contract: Mapping[str, tuple[str, tuple[str, ...]]], where: str
) -> None:
    """Every array of ``contract`` that ``ds`` holds has the dtype and dims the contract gives."""
    for name, (dtype, dims) in contract.items():
        if name not in ds.variables:
            continue
        var = ds[name]
        if var.dtype != np.dtype(dtype) or tuple(var.dims) != tuple(dims):
            raise StoreError(
                f"{where}: array {name!r} is {var.dtype} with dims {tuple(var.dims)}; "
                f"docs/contracts.md says {dtype} with dims {tuple(dims)}: the store was not "
                "written by this workflow or was altered; delete it and rerun its rule"
            )

"""Zarr conventions shared by every stage.

A store is zarr format 3, one group, every array with ``dimension_names`` and coordinate arrays for
labelled dimensions, so ``xarray.open_zarr(path)`` returns a labelled Dataset with no extra
arguments. Group attrs hold provenance. Writes go to a temporary sibling and are renamed into
place only when complete; reads check that every chunk was written and every float is finite.
Small files (JSON, CSV, text, figures) go through :func:`atomic_path` for the same guarantee.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.metadata
import json
import os
import shutil
import subprocess
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr

import repdiag
from repdiag.errors import StoreError

PROVENANCE_PACKAGES = ("numpy", "torch", "timm", "open_clip_torch", "zarr", "xarray", "scipy")


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
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
    versions = {}
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


def provenance(config: Mapping[str, Any] | None = None, seed: int | None = None) -> dict[str, Any]:
    """Attrs recording what produced a store: version, config subset, seed, time, packages, commit."""
    return {
        "repdiag_version": repdiag.__version__,
        "config": json.loads(json.dumps(dict(config or {}), default=str)),
        "seed": seed,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "packages": package_versions(),
        "git_commit": _git_commit(),
    }


def _temporary_sibling(target: Path) -> Path:
    return target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")


def _replace(tmp: Path, target: Path) -> None:
    """Move ``tmp`` onto ``target``; an old ``target`` survives until the new one is in place."""
    if target.is_dir() and not target.is_symlink():
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it onto ``target`` only if the block succeeds.

    Works for files and directories (zarr stores). On error the temporary path is removed and an
    existing ``target`` is left untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
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
    never a legitimately empty region.
    """
    path = Path(path)
    for name, var in ds.variables.items():
        check_finite(str(name), np.asarray(var.values), f"refusing to write {path}")
    ds = ds.copy()
    ds.attrs = {**ds.attrs, "provenance": provenance(config, seed)}
    with atomic_path(path) as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        ds.to_zarr(
            tmp,
            mode="w",
            zarr_format=3,
            consolidated=True,
            write_empty_chunks=True,
            encoding=dict(encoding or {}),
        )
    return path


def _check_chunks(path: Path) -> None:
    group = zarr.open_group(path, mode="r", zarr_format=3)
    for name, array in group.arrays():
        written, expected = array.nchunks_initialized, array.nchunks
        if written != expected:
            raise StoreError(
                f"store {path}: array {name!r} has {expected - written} of {expected} chunks missing; "
                "the store is partial or damaged: delete it and rerun the rule that produces it"
            )


def open_store(
    path: str | os.PathLike[str],
    *,
    required: Iterable[str] = (),
    check_values: bool = True,
) -> xr.Dataset:
    """Open a store written by :func:`write_store`, fully validated, loaded into memory.

    Fails with a :class:`StoreError` naming the store when it is missing, not zarr v3, lacks a
    ``required`` variable, has unwritten chunks, or holds NaN/inf.
    """
    path = Path(path)
    if not path.exists():
        raise StoreError(f"store {path} does not exist: run the workflow rule that produces it")
    try:
        _check_chunks(path)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning)
            ds = xr.open_zarr(path, zarr_format=3, consolidated=True).load()
    except StoreError:
        raise
    except Exception as err:  # zarr/xarray raise many types for corrupt metadata
        raise StoreError(
            f"store {path} cannot be read ({type(err).__name__}: {err}); "
            "delete it and rerun the rule that produces it"
        ) from err
    missing = [name for name in required if name not in ds.variables]
    if missing:
        raise StoreError(
            f"store {path} lacks required arrays {missing}; it was made by another version"
        )
    if check_values:
        for name, var in ds.variables.items():
            check_finite(str(name), np.asarray(var.values), f"store {path}")
    return ds

"""Human-readable summary of any repdiag store: dimensions, coordinates, provenance, arrays."""

from __future__ import annotations

import itertools
import json
import math
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import xarray as xr

from repdiag.core.errors import StoreError
from repdiag.core.store import check_finite, checked_store


def _coordinate_preview(values: np.ndarray, total: int, limit: int = 4) -> str:
    items = [str(v)[:80] for v in values[:limit]]
    more = f", ... ({total} total)" if total > limit else ""
    return ", ".join(items) + more


# Elements read at a time (per chunk, rows of a chunk when one is larger): memory stays bounded
# whatever shape a store declares.
READ_ELEMENTS = 1 << 22
# zarr decodes whole chunks: an array whose chunk would decode to more bytes is listed, unread.
CHUNK_BYTES_LIMIT = 1 << 28


def _blocks(var: xr.DataArray) -> Iterator[dict[str, slice]]:
    """Index slices covering ``var`` in pieces of at most about READ_ELEMENTS elements."""
    chunks = var.encoding.get("preferred_chunks") or {}
    steps = [int(chunks.get(dim, size)) or 1 for dim, size in zip(var.dims, var.shape, strict=True)]
    if steps:
        rest = int(np.prod(steps[1:], dtype=np.int64)) if len(steps) > 1 else 1
        steps[0] = max(1, min(steps[0], READ_ELEMENTS // max(rest, 1)))
    ranges = [range(0, size, step) for size, step in zip(var.shape, steps, strict=True)]
    for starts in itertools.product(*ranges):
        yield {
            dim: slice(start, start + step)
            for dim, start, step in zip(var.dims, starts, steps, strict=True)
        }


def _array_summary(path: Path, name: str, var: xr.DataArray) -> str:
    shape = "x".join(str(n) for n in var.shape)
    line = f"  {name:<28} ({', '.join(map(str, var.dims))}) {var.dtype} [{shape}]"
    if not var.size or var.dtype.kind not in "fiub":
        return line
    chunk = var.encoding.get("chunks") or var.shape
    chunk_bytes = math.prod(int(n) for n in chunk) * var.dtype.itemsize  # no int64 overflow
    if chunk_bytes > CHUNK_BYTES_LIMIT:
        return line + f"  (values not read: chunks of {chunk_bytes} bytes decoded)"
    low, high, total, count = np.inf, -np.inf, 0.0, 0
    for block in _blocks(var):
        try:
            values = np.asarray(var.isel(block).values)
        except StoreError:  # the guarded reader's refusal names the chunk and why
            raise
        except Exception as err:  # checksum mismatch, codec errors: name the array, not bytes
            raise StoreError(
                f"store {path}: array {name!r} cannot be read ({type(err).__name__}); "
                "the store is damaged: delete it and rerun the rule that produces it"
            ) from None
        if values.dtype.kind == "f":
            check_finite(name, values, f"store {path}")
        if values.size:
            low, high = min(low, float(values.min())), max(high, float(values.max()))
            total += float(values.sum(dtype=np.float64))
            count += values.size
    if count:
        line += f"  min {low:.4g}  mean {total / count:.4g}  max {high:.4g}"
    return line


def describe_store(path: str | Path) -> str:
    """Dimensions with sizes, coordinate previews, provenance attrs and per-array statistics.

    The store's files, metadata and chunks are checked (:func:`repdiag.core.store.checked_store`:
    what it decodes is bounded by its bytes on disk and each chunk by its array's chunk size) and
    the arrays summarised block by block:
    memory is bounded by READ_ELEMENTS, not the store's size. No index is built: a coordinate is
    read only for its first five values, which are printed.
    """
    path = Path(path)
    store = checked_store(path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)
        try:
            ds = xr.open_zarr(
                store, zarr_format=3, consolidated=True, chunks=None, create_default_indexes=False
            )
        except StoreError:
            raise
        except Exception as err:
            raise StoreError(
                f"store {path} cannot be opened ({type(err).__name__}); delete it and rerun "
                "the rule that produces it"
            ) from None
    lines = [f"store {path}", "dimensions:"]
    lines += [f"  {dim}: {size}" for dim, size in ds.sizes.items()]
    lines.append("coordinates:")
    lines += [
        f"  {name}: {_coordinate_preview(np.asarray(c[:5].values), len(c))}"
        if c.ndim == 1
        else f"  {name}: {c.dtype} {tuple(c.shape)}"
        for name, c in ds.coords.items()
    ]
    lines.append("arrays:")
    lines += [_array_summary(path, str(name), var) for name, var in ds.data_vars.items()]
    attrs = {k: v for k, v in ds.attrs.items() if k != "provenance"}
    if attrs:
        lines.append("attrs:")
        lines += [f"  {k}: {json.dumps(v, default=str)[:200]}" for k, v in attrs.items()]
    prov = ds.attrs.get("provenance")
    if prov:
        lines.append("provenance:")
        lines += [f"  {k}: {json.dumps(v, default=str)[:300]}" for k, v in prov.items()]
    return "\n".join(lines)

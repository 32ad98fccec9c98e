"""Human-readable summary of any repdiag store: dimensions, coordinates, provenance, arrays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import xarray as xr

from repdiag.store import open_store


def _coordinate_preview(values: np.ndarray, limit: int = 4) -> str:
    items = [str(v) for v in values[:limit]]
    more = f", ... ({len(values)} total)" if len(values) > limit else ""
    return ", ".join(items) + more


def _array_summary(name: str, var: xr.DataArray) -> str:
    shape = "x".join(str(n) for n in var.shape)
    line = f"  {name:<28} ({', '.join(map(str, var.dims))}) {var.dtype} [{shape}]"
    values = np.asarray(var.values)
    if values.size and values.dtype.kind in "fiub":
        line += f"  min {values.min():.4g}  mean {values.mean(dtype=np.float64):.4g}  max {values.max():.4g}"
    return line


def describe_store(path: str | Path) -> str:
    """Dimensions with sizes, coordinate previews, provenance attrs and per-array statistics."""
    ds = open_store(path)
    lines = [f"store {path}", "dimensions:"]
    lines += [f"  {dim}: {size}" for dim, size in ds.sizes.items()]
    lines.append("coordinates:")
    lines += [
        f"  {name}: {_coordinate_preview(np.asarray(c.values))}" for name, c in ds.coords.items()
    ]
    lines.append("arrays:")
    lines += [_array_summary(str(name), var) for name, var in ds.data_vars.items()]
    attrs = {k: v for k, v in ds.attrs.items() if k != "provenance"}
    if attrs:
        lines.append("attrs:")
        lines += [f"  {k}: {json.dumps(v, default=str)[:200]}" for k, v in attrs.items()]
    prov = ds.attrs.get("provenance")
    if prov:
        lines.append("provenance:")
        lines += [f"  {k}: {json.dumps(v, default=str)[:300]}" for k, v in prov.items()]
    return "\n".join(lines)

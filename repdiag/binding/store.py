"""Reading the binding store: the contract-checked Dataset, its images as flat sets with ids, and
the known shape-to-slot attributes of every image (docs/contracts.md)."""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np
import xarray as xr

from repdiag.binding.dataset import CONTRACT


def open_binding_store(
    path: str | os.PathLike[str], variables: Iterable[str] | None = None
) -> xr.Dataset:
    """The store at ``path`` checked against :data:`CONTRACT`, string coordinates as ``str``.

    zarr v3 variable-length strings read back as numpy StringDType, which ``.astype(str)``
    rejects; ``variables`` loads only those arrays (and their coordinates).
    """
    from repdiag.core.store import open_store

    ds = open_store(path, contract=CONTRACT, variables=variables)
    return ds.assign_coords(
        {
            name: np.asarray(ds[name].values.tolist(), dtype=str)
            for name in ds.coords
            if ds[name].dtype.kind == "T"
        }
    )


def image_ids(ds: xr.Dataset) -> dict[str, np.ndarray]:
    """Image ids of each set, in store order (see :func:`image_sets`)."""
    queries = ds["query"].values.astype(str)
    pairs = ds["pair"].values.astype(str)
    n_c = ds.sizes["candidate"]
    return {
        "query": np.array([f"query/{q}" for q in queries]),
        "candidate": np.array([f"candidate/{q}/c{c}" for q in queries for c in range(n_c)]),
        "pair": np.array([f"pair/{p}/m{m}" for p in pairs for m in (0, 1)]),
    }


def image_sets(ds: xr.Dataset) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The store's images as flat sets: name -> (ids (N,) str, uint8 images (N, H, W, 3)).

    ``query``: "query/q00003"; ``candidate``: "candidate/q00003/c5" (query-major);
    ``pair``: "pair/p00004/m1" (pair-major).
    """
    ids = image_ids(ds)
    image_shape = ds["query_image"].shape[1:]
    return {
        "query": (ids["query"], np.asarray(ds["query_image"].values)),
        "candidate": (
            ids["candidate"],
            np.asarray(ds["candidate_image"].values).reshape(-1, *image_shape),
        ),
        "pair": (ids["pair"], np.asarray(ds["pair_image"].values).reshape(-1, *image_shape)),
    }


def slot_attributes(ds: xr.Dataset) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Known attributes of every image: ``(ids, names, indicators)``, "shape s sits in slot k".

    ``ids`` as in :func:`image_sets` (query, candidate, pair order); ``names`` ``"<slot>=<shape>"``
    slot-major (e.g. ``"r0c1=square"``); ``indicators`` (N, n_slots * n_shapes) float32, 1 where
    the image has that shape in that slot. These are the binding itself, known exactly for every
    rendered image; the alignment study's real-embedding intervention metrics read them.
    """
    slots = ds["slot"].values.astype(str)
    shapes = ds["shape_name"].values.astype(str)
    per_set = {
        "query": ds["query_shape"].values.reshape(-1, len(slots)),
        "candidate": ds["candidate_shape"].values.reshape(-1, len(slots)),
        "pair": ds["pair_shape"].values.reshape(-1, len(slots)),
    }
    ids_by_set = image_ids(ds)
    ids = np.concatenate(list(ids_by_set.values()))
    arrangement = np.concatenate([per_set[name] for name in ids_by_set]).astype(np.int64)
    one_hot = arrangement[:, :, None] == np.arange(len(shapes))[None, None, :]
    names = [f"{slot}={shape}" for slot in slots for shape in shapes]
    return ids, names, one_hot.reshape(len(ids), -1).astype(np.float32)

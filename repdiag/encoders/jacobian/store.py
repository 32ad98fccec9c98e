"""The spectra store ``results/jacobians/<model>.zarr`` (docs/contracts.md): its contract, which
every reader validates against (:data:`STORE_CONTRACT`), and the Dataset written from a
:class:`~repdiag.encoders.jacobian.engine.Spectra` (:func:`spectra_dataset`).

``singular_values`` (layer, image, rank) float32, the top k sorted descending (zero-padded where a
layer has fewer); ``jer_<formula>`` (layer, image) over those top k; where some layer was computed
exactly, its whole spectrum too: ``singular_values_full`` (layer, image, rank_full), zero-padded,
with ``n_singular`` (layer,) valid values (0 for randomized layers). Coordinates ``layer``,
``image``, ``probe_set`` (image,), ``rank``; attrs ``methods`` (per layer), ``d_out``, ``d_in``,
``k``, ``pass_sizing`` when the spectra carry it (how :func:`.cache.run_chunked` sized each
pass: planned, measured on the GPU, halved after an out-of-memory error) and what the writer
adds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

if TYPE_CHECKING:  # the writer's types; readers (table and plot jobs) never import torch
    import torch

    from repdiag.encoders.jacobian.engine import Spectra

STORE_CONTRACT: dict[str, tuple[str, tuple[str, ...]]] = {
    "singular_values": ("float32", ("layer", "image", "rank")),
    "singular_values_full": ("float32", ("layer", "image", "rank_full")),
    "jer_pr": ("float32", ("layer", "image")),
    "jer_pr2": ("float32", ("layer", "image")),
    "jer_entropy": ("float32", ("layer", "image")),
    "n_singular": ("int64", ("layer",)),
}
"""dtype and dims of ``results/jacobians/<model>.zarr``, checked on read (docs/contracts.md is
generated from it and :data:`MEANING`: ``python -m repdiag.contracts``)."""

MEANING: dict[str, str] = {
    "singular_values": "top-k singular values of each image's Jacobian, descending, zero-padded",
    "singular_values_full": "the whole spectrum where a layer was computed exactly, zero-padded",
    "jer_pr": "participation ratio (sum s)^2 / sum s^2 of the top k",
    "jer_pr2": "the same of the squared values, (sum s^2)^2 / sum s^4",
    "jer_entropy": "exp of the entropy of s / sum s",
    "n_singular": "valid length of `singular_values_full` (0 for randomized layers)",
}
"""What each array of :data:`STORE_CONTRACT` holds."""


def _padded(values: torch.Tensor, width: int) -> np.ndarray:
    import torch

    values = values[:, :width].to(torch.float64)
    return torch.nn.functional.pad(values, (0, width - values.shape[1])).numpy()


def spectra_dataset(
    spectra: Spectra,
    ids: Sequence[str],
    probe_set: Sequence[str],
    *,
    k: int,
    formulas: Sequence[str],
    attrs: Mapping[str, Any] | None = None,
) -> xr.Dataset:
    """The store's Dataset: top-k spectra, JER per formula, the full exact spectra when computed."""
    from repdiag.encoders.jacobian.jer import jer

    layers = list(spectra)
    top = np.stack([_padded(spectra[name], k) for name in layers])
    data: dict[str, Any] = {"singular_values": (("layer", "image", "rank"), top.astype(np.float32))}
    for formula in formulas:
        values = np.stack([jer(spectra[name], formula, top_k=k).numpy() for name in layers])
        data[f"jer_{formula}"] = (("layer", "image"), values.astype(np.float32))
    coords: dict[str, Any] = {  # fixed-width unicode like the other stores (reads back as <U)
        "layer": np.array([str(name) for name in layers]),
        "image": np.array([str(i) for i in ids]),
        "probe_set": ("image", np.array([str(name) for name in probe_set])),
        "rank": np.arange(k),
    }
    exact = [name for name in layers if spectra.methods[name] == "exact"]
    if exact:
        width = max(spectra[name].shape[1] for name in exact)
        full = np.stack(
            [
                _padded(spectra[name], width) if name in exact else np.zeros((len(ids), width))
                for name in layers
            ]
        )
        data["singular_values_full"] = (("layer", "image", "rank_full"), full.astype(np.float32))
        counts = [spectra[name].shape[1] if name in exact else 0 for name in layers]
        data["n_singular"] = (("layer",), np.array(counts, dtype=np.int64))
        coords["rank_full"] = np.arange(width)
    base = {
        "methods": dict(spectra.methods),
        "d_out": dict(spectra.d_out),
        "d_in": int(spectra.d_in),
        "k": int(k),
    }
    if getattr(spectra, "pass_sizing", None):
        base["pass_sizing"] = dict(spectra.pass_sizing)
    return xr.Dataset(data, coords=coords, attrs={**base, **dict(attrs or {})})

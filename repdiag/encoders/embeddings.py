"""Per-layer embeddings of the benchmark images (and an optional folder of natural images).

``results/embeddings/<model>.zarr`` (docs/contracts.md): one float32 variable ``emb_<layer>`` with
dims (``image``, ``dim_<layer>``) per tap, coordinates ``image`` (ids such as ``query/q00003``,
``candidate/q00003/c5``, ``pair/p00004/m1``, ``folder/<relative path>``), ``image_set`` (image,)
and ``layer`` (depth order); attrs ``model``, ``entry``, ``family``, ``source``, ``preprocess``,
``pooling``, ``taps``, ``device``, ``precision``, ``numerics`` and ``provenance``.

Embeddings are computed under the numerics of the Jacobian stage
(:func:`repdiag.core.gpu.numerics`): ``fp32`` by default, i.e. TF32 off for matmuls and cuDNN
convolutions (torch's own default lets cuDNN convolutions use TF32, so CNN embeddings on a GPU
would otherwise not be IEEE float32 while their Jacobians are) and deterministic algorithms on
CUDA; the switches used are recorded in the ``numerics`` attr.
"""

from __future__ import annotations

import json
import logging
import re
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from repdiag.core.errors import EncoderError, StoreError
from repdiag.core.gpu import autocast, numerics
from repdiag.core.runtime import Progress, select_device
from repdiag.core.store import check_finite, checked_store, open_store, write_store
from repdiag.encoders.factory import Encoder, build_encoder
from repdiag.encoders.preprocess import load_image_folder

log = logging.getLogger(__name__)

GROUPED_SETS = {"candidate": "candidates per query", "pair": "members per pair"}
ImageSets = Mapping[str, tuple[Sequence[str], np.ndarray]]
"""Image sets to embed: name -> (ids, uint8 images (N, H, W, 3)), e.g. the binding store's query,
candidate and pair sets (read by the workflow script, not here: the encoders import no study)."""


def _first_bad_ids(array: np.ndarray, ids: np.ndarray, n: int = 3) -> list[str]:
    rows = np.flatnonzero(~np.isfinite(array).all(axis=1))
    return [str(ids[i]) for i in rows[:n]]


def _check_features(key: str, arrays: Mapping[str, np.ndarray], ids: np.ndarray) -> None:
    """Refuse non-finite features, naming the array, the count and the first images concerned."""
    for layer, array in arrays.items():
        bad = int(array.size - np.count_nonzero(np.isfinite(array)))
        if bad:
            raise EncoderError(
                f"model {key!r}: array 'emb_{layer}' has {bad} non-finite (NaN or infinite) "
                f"values of {array.size}, first in images {_first_bad_ids(array, ids)}; the weights or "
                "the inputs are broken, so no store is written"
            )


def _store_attrs(
    encoder: Encoder, device: str | torch.device, record: Mapping[str, Any]
) -> dict[str, Any]:
    """The embeddings store's attrs (docs/contracts.md): what built the features, where, and
    under which numerics (``record``: :func:`repdiag.core.gpu.numerics`' record)."""
    return {
        "model": encoder.key,
        "entry": json.loads(json.dumps(encoder.entry, default=str)),
        "family": encoder.family,
        "source": encoder.source,
        "preprocess": encoder.preprocess.as_dict(),
        "pooling": encoder.pooling,
        "taps": encoder.plan.kind,
        "device": str(device),
        "precision": str(record["precision"]),
        "numerics": json.loads(json.dumps(dict(record), default=str)),
    }


def extract_embeddings(
    encoder: Encoder,
    image_sets: ImageSets,
    *,
    batch_size: int,
    device: str | torch.device = "auto",
    layers: Iterable[str] | None = None,
    precision: str = "fp32",
) -> xr.Dataset:
    """Run every image through ``encoder`` in batches and return the embeddings Dataset.

    Images are uint8 (N, H, W, 3); each batch is moved to ``device`` as uint8, preprocessed there and
    tapped under ``torch.inference_mode`` and :func:`repdiag.core.gpu.numerics` at ``precision``
    (``fp32``, ``tf32`` or ``bf16``, as ``jacobians.precision``; ``bf16`` under bfloat16
    autocast), whose record is stored. Non-finite features are an :class:`EncoderError` naming
    the array, the count and the first images concerned.
    """
    device = select_device(device) if isinstance(device, str) else device
    encoder.to(device)
    names = encoder.layers if layers is None else [n for n in encoder.layers if n in set(layers)]
    ids = np.array([i for _, (set_ids, _) in image_sets.items() for i in set_ids], dtype=object)
    set_of = np.array([s for s, (set_ids, _) in image_sets.items() for _ in set_ids], dtype=object)
    total = len(ids)
    if total == 0:
        raise EncoderError(f"model {encoder.key!r}: no images to embed")
    for name, (set_ids, images) in image_sets.items():
        if len(set_ids) != len(images):
            raise EncoderError(f"image set {name!r}: {len(set_ids)} ids but {len(images)} images")
    arrays: dict[str, np.ndarray] = {}
    progress = Progress(total, f"{encoder.key} embeddings")
    offset, start = 0, time.monotonic()
    with (
        torch.inference_mode(),
        numerics(precision, device) as record,
        autocast(precision, device),
    ):
        for name, (_, images) in image_sets.items():
            for lo in range(0, len(images), batch_size):
                batch = torch.from_numpy(np.ascontiguousarray(images[lo : lo + batch_size])).to(
                    device
                )
                try:
                    outputs = encoder.layer_outputs(encoder.preprocess(batch), names)
                except EncoderError:
                    raise
                except RuntimeError as err:
                    raise EncoderError(
                        f"model {encoder.key!r} failed on image set {name!r} at input size "
                        f"{encoder.preprocess.input_size} ({err}); check preprocess.input_size and kwargs"
                    ) from err
                n = batch.shape[0]
                for layer, features in outputs.items():
                    if layer not in arrays:
                        arrays[layer] = np.empty((total, features.shape[1]), dtype=np.float32)
                    arrays[layer][offset : offset + n] = features.to(torch.float32).cpu().numpy()
                offset += n
                progress.update(n)
    elapsed = time.monotonic() - start
    log.info(
        "%s: %d images, %d layers in %.1f s (%.1f images/s) on %s",
        encoder.key,
        total,
        len(names),
        elapsed,
        total / max(elapsed, 1e-9),
        device,
    )
    _check_features(encoder.key, arrays, ids)
    data_vars = {f"emb_{layer}": (("image", f"dim_{layer}"), arrays[layer]) for layer in names}
    # fixed-width unicode like the other stores: it reads back as <U, so `.astype(str)` works
    coords = {
        "image": ids.astype(str),
        "image_set": ("image", set_of.astype(str)),
        "layer": np.array(names, dtype=str),
    }
    return xr.Dataset(data_vars, coords=coords, attrs=_store_attrs(encoder, device, record))


def write_embeddings(
    path: str | Path,
    ds: xr.Dataset,
    *,
    config: Mapping[str, Any] | None = None,
    seed: int | None = None,
) -> Path:
    """Write the Dataset with :func:`repdiag.core.store.write_store` (atomic, provenance attrs)."""
    with warnings.catch_warnings():  # zarr flags fixed-width unicode as not yet in the v3 spec
        warnings.filterwarnings(
            "ignore", message="The data type .* does not have a Zarr V3 specification"
        )
        return write_store(path, ds, config=config, seed=seed)


def extract_model(
    key: str,
    entry: Mapping[str, Any],
    output: str | Path,
    *,
    image_sets: ImageSets,
    folder: str | Path | None = None,
    batch_size: int,
    device: str = "auto",
    zoo_dir: str | Path = "results/zoo",
    config: Mapping[str, Any] | None = None,
    precision: str = "fp32",
) -> xr.Dataset:
    """Build model ``key``, embed ``image_sets`` (plus ``folder``, at the encoder's input size)
    at ``precision`` (:func:`extract_embeddings`) and write ``output``."""
    encoder = build_encoder(key, entry, zoo_dir=zoo_dir)
    sets: dict[str, tuple[Sequence[str], np.ndarray]] = dict(image_sets)
    if folder:
        sets["folder"] = load_image_folder(folder, encoder.preprocess.input_size)
    ds = extract_embeddings(
        encoder, sets, batch_size=batch_size, device=device, precision=precision
    )
    write_embeddings(output, ds, config=config)
    return ds


# --- reading --------------------------------------------------------------------------------------

_MEMBER = re.compile(r"(\d+)$")


def _open_layer(path: Path, variable: str) -> xr.Dataset:
    """Open only ``variable`` (+ coordinates) of an embeddings store, validated.

    Metadata and chunk completeness are checked for the whole store, checksums and finiteness
    for what is loaded (:func:`repdiag.core.store.open_store`).
    """
    if not path.exists():
        raise StoreError(f"store {path} does not exist: run the rule extract_embeddings")
    store = checked_store(path)  # checked before zarr parses any of it
    names = list(store.bounds)
    if variable not in names:
        layers = [name[4:] for name in names if name.startswith("emb_")]
        raise StoreError(f"store {path} has no array {variable!r}; its layers are {layers}")
    return open_store(path, variables=[variable, "image_set"], checked=store)


def _grouped(ids: np.ndarray, values: np.ndarray, where: str, image_set: str) -> np.ndarray:
    """Reshape rows ordered group-major (``set/<group>/<member k>``) to (groups, members, d)."""
    parts = [str(i).split("/") for i in ids]
    groups = list(dict.fromkeys(p[1] for p in parts))
    n_members = len(ids) // len(groups)
    members = [int(_MEMBER.search(p[-1]).group(1)) if _MEMBER.search(p[-1]) else -1 for p in parts]
    expected_groups = [g for g in groups for _ in range(n_members)]
    if (
        len(ids) != len(groups) * n_members
        or [p[1] for p in parts] != expected_groups
        or members != list(range(n_members)) * len(groups)
    ):
        raise StoreError(
            f"{where}: the {image_set} images are not stored {GROUPED_SETS[image_set]} in order"
        )
    return values.reshape(len(groups), n_members, values.shape[-1])


def _check_variance(rows: np.ndarray, variable: str, where: str, image_set: str) -> None:
    """Refuse embeddings that are one constant value; flag constant rows by count."""
    if rows.size and rows.min() == rows.max():
        raise StoreError(
            f"{where}: array {variable!r} ({image_set} images) is the constant {float(rows.flat[0])!r} "
            "everywhere (zero variance): every metric of it would be degenerate; the model's "
            "layer is dead or the store was overwritten. Check the model, delete the store and rerun"
        )
    constant = int(np.count_nonzero(rows.min(axis=1) == rows.max(axis=1))) if rows.size else 0
    if constant:
        log.warning(
            "%s: array %r has %d of %d %s rows constant (one value for every dimension)",
            where,
            variable,
            constant,
            len(rows),
            image_set,
        )


def read_embeddings(path: str | Path | xr.Dataset, layer: str, image_set: str) -> np.ndarray:
    """One layer's features of one image set.

    Returns query (n_q, d), candidate (n_q, n_c, d), pair (n_p, 2, d), folder (n, d).
    """
    variable = f"emb_{layer}"
    if isinstance(path, xr.Dataset):
        ds, where = path, "embeddings dataset"
        if variable not in ds:
            raise StoreError(f"{where} has no array {variable!r}")
    else:
        where = f"store {path}"
        ds = _open_layer(Path(path), variable)
    sets = ds["image_set"].values.astype(str)
    mask = sets == image_set
    if not mask.any():
        raise StoreError(
            f"{where} has no images of set {image_set!r}; it has {sorted(set(sets.tolist()))}"
        )
    array = ds[variable]
    if array.dtype != np.float32 or array.ndim != 2 or array.dims[0] != "image":
        raise StoreError(
            f"{where}: array {variable!r} is {array.dtype} with dims {tuple(array.dims)}; "
            f"docs/contracts.md says float32 with dims ('image', 'dim_{layer}'): the store was "
            "not written by this workflow or was edited; delete it and rerun extract_embeddings"
        )
    values = np.asarray(array.values[mask], dtype=np.float32)
    check_finite(variable, values, where)
    _check_variance(values.reshape(-1, values.shape[-1]), variable, where, image_set)
    if image_set in GROUPED_SETS:
        return _grouped(ds["image"].values[mask], values, where, image_set)
    return values

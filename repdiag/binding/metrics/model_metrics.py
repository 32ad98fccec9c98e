"""Every binding-study metric of one model, per layer, from the dataset and embedding stores.

Reads ``results/datasets/binding.zarr`` (``correct_index``, ``pair_same``, the query and pair ids)
and ``results/embeddings/<model>.zarr`` (``emb_<layer>`` over ``image``, ids as in
``docs/contracts.md``), aligns them by image id, and returns the JSON structure of
``results/metrics/<model>.json``: per layer the geometry metrics on the reference set, binding
accuracy under each readout, and the Same/Different probe.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from repdiag.binding.dataset import CONTRACT
from repdiag.binding.metrics.geometry import geometry_metrics
from repdiag.binding.metrics.options import MetricsSettings, ReadoutSettings, ReferenceSettings
from repdiag.binding.metrics.probes import PROBE_FIELDS, same_different_probe
from repdiag.binding.metrics.readouts import WIN_RATE_CHANCE, binding_accuracy
from repdiag.common.intervals import WILSON
from repdiag.core.errors import ConfigError, StoreError
from repdiag.core.runtime import Progress
from repdiag.core.store import open_store

log = logging.getLogger(__name__)

DATASET_ARRAYS = ("correct_index", "pair_same")
# Every binding entry has these plus ``skipped`` (bool); a skipped readout (one that cannot apply
# to a layer, see :func:`readout_skip_note`) has null accuracy, interval and hits and a ``note``.
BINDING_FIELDS = (
    "accuracy", "ci_low", "ci_high", "n", "hits", "ci_method",
    "win_rate", "win_rate_ci_low", "win_rate_ci_high",
)  # fmt: skip


@dataclass(frozen=True)
class BindingTask:
    """Labels of the binding dataset and the rows of each image in the embedding store."""

    correct_index: np.ndarray  # (n_q,)
    pair_same: np.ndarray  # (n_p,)
    query_rows: np.ndarray  # (n_q,)
    candidate_rows: np.ndarray  # (n_q, n_c)
    pair_rows: np.ndarray  # (n_p, 2)
    reference_rows: np.ndarray  # (n_r,)


def _strings(values: xr.DataArray) -> np.ndarray:
    """Labels as a fixed-width str array, whatever numpy string dtype zarr handed back."""
    return np.array([str(v) for v in np.asarray(values.values).ravel()], dtype=str)


def _row_lookup(image_ids: Sequence[str], store: Path, dataset: Path) -> Any:
    """A function mapping an array of image ids to their rows in the embedding store."""
    index = {image_id: row for row, image_id in enumerate(image_ids)}
    if len(index) != len(image_ids):
        raise StoreError(
            f"embedding store {store} lists some image ids twice; rerun extract_embeddings"
        )

    def rows(ids: np.ndarray) -> np.ndarray:
        try:
            return np.vectorize(index.__getitem__, otypes=[np.int64])(ids)
        except KeyError as err:
            raise StoreError(
                f"embedding store {store} has no image {err.args[0]!r} of the dataset {dataset}; "
                "the stores come from different runs: rerun extract_embeddings"
            ) from None

    return rows


def _labels(ds: xr.Dataset, path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    correct = np.asarray(ds["correct_index"].values)
    same = np.asarray(ds["pair_same"].values)
    n_c = int(ds.sizes.get("candidate", 0))
    if correct.dtype.kind not in "iu" or correct.ndim != 1 or n_c < 2:
        raise StoreError(
            f"dataset {path}: 'correct_index' must be (query,) integers with >= 2 candidates"
        )
    if np.any((correct < 0) | (correct >= n_c)):
        raise StoreError(f"dataset {path}: 'correct_index' has values outside [0, {n_c})")
    if same.ndim != 1 or not np.isin(same, (0, 1)).all():
        raise StoreError(f"dataset {path}: 'pair_same' must be (pair,) values in {{0, 1}}")
    return correct.astype(np.int64), same.astype(np.int64), n_c


def _reference_rows(
    emb: xr.Dataset, path: Path, reference: ReferenceSettings, seed: int
) -> np.ndarray:
    """Rows of the reference images (``image_set`` in ``image_sets``), at most ``max_size``."""
    image_sets, max_size = reference.image_sets, reference.max_size
    labels = _strings(emb["image_set"])
    missing = [name for name in image_sets if name not in set(labels)]
    if missing:
        raise StoreError(
            f"embedding store {path} has no images of set {missing} (metrics.reference.image_sets); "
            f"it holds {sorted(set(labels))}"
        )
    rows = np.flatnonzero(np.isin(labels, list(image_sets)))
    # Ordered by image id, so the set and its subsample do not depend on the store's row order.
    rows = rows[np.argsort(_strings(emb["image"])[rows], kind="stable")]
    if rows.size > max_size:
        keep = np.random.default_rng(seed).choice(rows.size, size=max_size, replace=False)
        rows = rows[np.sort(keep)]
    return rows


def binding_task(
    ds: xr.Dataset,
    dataset_path: Path,
    emb: xr.Dataset,
    embeddings_path: Path,
    reference: ReferenceSettings,
    seed: int,
) -> BindingTask:
    """Align the dataset's queries, candidates and pairs with the embedding store's rows by id."""
    correct, same, n_c = _labels(ds, dataset_path)
    rows = _row_lookup(list(_strings(emb["image"])), embeddings_path, dataset_path)
    queries = _strings(ds["query"])
    pairs = _strings(ds["pair"])
    candidate_ids = np.array([[f"candidate/{q}/c{j}" for j in range(n_c)] for q in queries])
    pair_ids = np.array([[f"pair/{p}/m{m}" for m in (0, 1)] for p in pairs])
    return BindingTask(
        correct_index=correct,
        pair_same=same,
        query_rows=rows(np.char.add("query/", queries)),
        candidate_rows=rows(candidate_ids),
        pair_rows=rows(pair_ids),
        reference_rows=_reference_rows(emb, embeddings_path, reference, seed),
    )


def _check_sizes(task: BindingTask, settings: MetricsSettings, path: Path, dataset: Path) -> None:
    """Neighbourhood sizes and probe folds that the stores' actual sizes cannot satisfy.

    Readouts are not checked here: one that cannot apply is skipped per layer (``layer_metrics``).
    """
    folds = settings.probe.folds
    smallest = int(np.bincount(task.pair_same, minlength=2).min())
    if smallest < folds:
        raise ConfigError(
            f"metrics.probe.folds={folds} exceeds the {smallest} pairs of the smaller "
            f"Same/Different class in {dataset}"
        )
    n_reference = task.reference_rows.size
    where = f"the reference set of {path} has {n_reference} embeddings (metrics.reference)"
    for k in settings.geometry.l_iso_k:
        if k >= n_reference:
            raise ConfigError(
                f"metrics.geometry.l_iso_k: k={k} needs more than k points, but {where}"
            )


def select_layers(layers: Sequence[str], which: str) -> list[str]:
    """``all`` -> every layer in depth order; ``final`` -> ``['final']``, else the deepest layer."""
    if which == "all":
        return list(layers)
    if which == "final":
        return ["final"] if "final" in layers else [layers[-1]]
    raise ConfigError(f"metrics.layers must be 'all' or 'final', got {which!r}")


def readout_skip_note(
    name: str, readouts: ReadoutSettings, width: int, n_reference: int
) -> str | None:
    """Why readout ``name`` cannot apply to a layer of ``width`` dims (None when it can).

    ``knn`` and ``local_pca`` need ``k <= n_reference``; ``local_pca`` also ``dim <= k - 1`` and
    ``dim <= width`` (a centred set of ``k`` points in ``width`` dims spans at most that many).
    """
    if name not in ("knn", "local_pca"):
        return None
    k = getattr(readouts, name).k
    if k > n_reference:
        return f"{name} needs k={k} <= reference size {n_reference}; skipped for this layer"
    if name == "local_pca":
        dim = readouts.local_pca.dim
        if dim > width:
            return f"local_pca needs dim={dim} <= embedding width {width}; skipped for this layer"
        if dim > k - 1:
            return f"local_pca needs dim={dim} <= k - 1 = {k - 1}; skipped for this layer"
    return None


def layer_metrics(
    features: np.ndarray, task: BindingTask, settings: MetricsSettings, seed: int
) -> dict[str, Any]:
    """Geometry, binding per readout and the Same/Different probe of one layer's (image, d) features."""
    reference = features[task.reference_rows]
    query, candidates = features[task.query_rows], features[task.candidate_rows]
    binding = {}
    readouts = settings.readouts
    for name in readouts.names:
        note = readout_skip_note(name, readouts, features.shape[1], reference.shape[0])
        if note is not None:
            log.warning("readout %s: %s", name, note)
            binding[name] = {
                **dict.fromkeys(BINDING_FIELDS),
                "n": int(query.shape[0]),
                "ci_method": WILSON,
                "skipped": True,
                "note": note,
            }
            continue
        result = binding_accuracy(
            query, candidates, task.correct_index, name, reference, **readouts.keywords(name)
        )
        binding[name] = {key: result[key] for key in BINDING_FIELDS} | {"skipped": False}
    same_different = same_different_probe(
        features[task.pair_rows], task.pair_same, settings.probe, seed
    )
    return {
        "geometry": geometry_metrics(reference, settings.geometry.l_iso_k),
        "binding": binding,
        "same_different": {k: same_different[k] for k in PROBE_FIELDS},
    }


def compute_model_metrics(
    dataset_path: str | Path,
    embeddings_path: str | Path,
    *,
    model: str,
    family: str | None = None,
    source: str | None = None,
    settings: MetricsSettings,
    seed: int,
) -> dict[str, Any]:
    """Per-layer metrics of one model, as the JSON of ``results/metrics/<model>.json``.

    ``settings`` is the config's ``metrics`` section (``MetricsSettings.from_config``);
    ``seed`` fixes the reference subsample and the probe folds. Malformed, mismatched or
    non-finite stores raise :class:`StoreError` naming the store.
    """
    dataset_path, embeddings_path = Path(dataset_path), Path(embeddings_path)
    ds = open_store(dataset_path, required=[*DATASET_ARRAYS, "query", "pair"], contract=CONTRACT)
    emb = open_store(embeddings_path, required=["image", "image_set", "layer"])
    all_layers = [str(name) for name in np.asarray(emb["layer"].values)]
    if not all_layers:
        raise StoreError(f"embedding store {embeddings_path} lists no layers")
    missing = [f"emb_{name}" for name in all_layers if f"emb_{name}" not in emb]
    if missing:
        raise StoreError(f"embedding store {embeddings_path} lacks arrays {missing} of its layers")
    family = family if family is not None else emb.attrs.get("family")
    source = source if source is not None else emb.attrs.get("source")
    task = binding_task(ds, dataset_path, emb, embeddings_path, settings.reference, seed)
    _check_sizes(task, settings, embeddings_path, dataset_path)
    layers = select_layers(all_layers, settings.layers)
    progress = Progress(len(layers), f"metrics of {model}", logger=log)
    per_layer = {}
    for layer in layers:
        features = np.asarray(emb[f"emb_{layer}"].values, dtype=np.float64)
        if features.ndim != 2 or features.shape[0] != emb.sizes["image"]:
            raise StoreError(
                f"embedding store {embeddings_path}: 'emb_{layer}' must be (image, dim)"
            )
        per_layer[layer] = layer_metrics(features, task, settings, seed)
        log.info(
            "%s %s: %s",
            model,
            layer,
            {k: v["accuracy"] for k, v in per_layer[layer]["binding"].items()},
        )
        progress.update()
    n_q, n_c = task.candidate_rows.shape
    return {
        "model": model,
        "family": family,
        "source": source,
        "config": {"metrics": settings.to_config(), "seed": seed},
        "inputs": {"dataset": str(dataset_path), "embeddings": str(embeddings_path)},
        "chance": 1.0 / n_c,
        "win_rate_chance": WIN_RATE_CHANCE,
        "sizes": {
            "n_queries": int(n_q),
            "n_candidates": int(n_c),
            "n_pairs": int(task.pair_rows.shape[0]),
            "n_reference": int(task.reference_rows.size),
        },
        "layers": layers,
        "final_layer": "final" if "final" in all_layers else all_layers[-1],
        "per_layer": per_layer,
    }

"""Options of the metrics stage: defaults (from the schema) and the checks it cannot express.

Kept free of heavy imports: the Snakefile runs :func:`check_metrics_config` on every parse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repdiag.core.config import schema_defaults
from repdiag.core.errors import ConfigError


def merge_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` over the schema's defaults of ``metrics``, nested (for calls outside the workflow)."""

    def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(base[key], value) if isinstance(base.get(key), Mapping) else value
        return out

    return merge(schema_defaults("metrics"), options or {})


def _binding_sizes(config: Mapping[str, Any]) -> dict[str, int]:
    binding = config.get("datasets", {}).get("binding", {})
    n_q, n_c, n_p = (binding.get(key) for key in ("n_queries", "n_candidates", "n_pairs"))
    sizes = {}
    if isinstance(n_q, int):
        sizes["query"] = n_q
        if isinstance(n_c, int):
            sizes["candidate"] = n_q * n_c
    if isinstance(n_p, int):
        sizes["pair"] = 2 * n_p
    return sizes


def check_metrics_config(config: Mapping[str, Any]) -> None:
    """Semantic checks of ``metrics`` (registered in ``repdiag.binding.CONFIG_CHECKS``).

    Neighbourhood sizes must fit in the reference set, the local PCA dimension below its k, and
    the probe folds within each Same/Different class (``datasets.binding.n_pairs / 2``), and the
    inner folds of the C search within each class of an outer training fold.
    """
    options = merge_options(config.get("metrics") or {})
    max_size = options["reference"]["max_size"]
    known = _binding_sizes(config)
    sets = options["reference"]["image_sets"]
    folder = (config.get("embeddings") or {}).get("folder")
    if "folder" in sets and not folder:
        raise ConfigError(
            "metrics.reference.image_sets: 'folder' needs embeddings.folder (a folder of natural "
            "images) set; without it the embeddings have no such image set"
        )
    if all(name in known for name in sets):
        max_size = min(max_size, sum(known[name] for name in sets))
    where = f"the reference set (at most {max_size} embeddings)"
    for k in options["geometry"]["l_iso_k"]:
        if k >= max_size:
            raise ConfigError(
                f"metrics.geometry.l_iso_k: k={k} needs more than k points in {where}"
            )
    readouts = options["readouts"]
    for name in ("knn", "local_pca"):
        if name in readouts["names"] and readouts[name]["k"] > max_size:
            raise ConfigError(f"metrics.readouts.{name}.k={readouts[name]['k']} exceeds {where}")
    if readouts["local_pca"]["dim"] >= readouts["local_pca"]["k"]:
        raise ConfigError(
            f"metrics.readouts.local_pca.dim={readouts['local_pca']['dim']} must be below "
            f"metrics.readouts.local_pca.k={readouts['local_pca']['k']}"
        )
    n_pairs = config.get("datasets", {}).get("binding", {}).get("n_pairs")
    folds = options["probe"]["folds"]
    if isinstance(n_pairs, int) and folds > n_pairs // 2:
        raise ConfigError(
            f"metrics.probe.folds={folds} exceeds the {n_pairs // 2} pairs of each "
            "Same/Different class (datasets.binding.n_pairs / 2)"
        )
    inner = options["probe"]["inner_folds"]
    if isinstance(n_pairs, int):
        per_class = n_pairs // 2
        training = per_class - -(-per_class // folds)  # fewest per class in an outer training fold
        if inner > training:
            raise ConfigError(
                f"metrics.probe.inner_folds={inner} exceeds the {training} pairs of each "
                f"Same/Different class in an outer training fold (datasets.binding.n_pairs / 2 "
                f"= {per_class} minus one of metrics.probe.folds={folds} test folds)"
            )

"""Settings of the metrics stage (``MetricsSettings``, one typed object for the ``metrics``
section, every default from schemas/metrics.schema.yaml) and the checks the schema cannot express.

Kept free of heavy imports: the Snakefile runs :func:`check_metrics_config` on every parse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from repdiag.core.errors import ConfigError
from repdiag.core.settings import FromConfig


@dataclass(frozen=True)
class ReferenceSettings(FromConfig):
    """``metrics.reference``: the image sets pooled into the reference set and its largest size."""

    SECTION: ClassVar[str] = "metrics.reference"
    image_sets: Sequence[str]
    max_size: int


@dataclass(frozen=True)
class KnnSettings(FromConfig):
    """``metrics.readouts.knn``: the keywords of ``readouts.knn_scores``."""

    SECTION: ClassVar[str] = "metrics.readouts.knn"
    k: int
    weights: str


@dataclass(frozen=True)
class LocalPCASettings(FromConfig):
    """``metrics.readouts.local_pca``: the keywords of ``readouts.local_pca_scores``."""

    SECTION: ClassVar[str] = "metrics.readouts.local_pca"
    k: int
    dim: int


@dataclass(frozen=True)
class ReadoutSettings(FromConfig):
    """``metrics.readouts``: which readouts to compute, and the settings of those that take any."""

    SECTION: ClassVar[str] = "metrics.readouts"
    names: Sequence[str]
    knn: KnnSettings
    local_pca: LocalPCASettings

    def keywords(self, name: str) -> dict[str, Any]:
        """The keywords readout ``name`` is called with: its subsection's fields (none for
        cosine)."""
        part = getattr(self, name, None)
        return dataclasses.asdict(part) if isinstance(part, FromConfig) else {}


@dataclass(frozen=True)
class GeometrySettings(FromConfig):
    """``metrics.geometry``: the neighbourhood sizes of the local isotropy L.Iso."""

    SECTION: ClassVar[str] = "metrics.geometry"
    l_iso_k: Sequence[int]


@dataclass(frozen=True)
class ProbeSettings(FromConfig):
    """``metrics.probe``: outer and inner folds, the C grid and lbfgs's iteration cap."""

    SECTION: ClassVar[str] = "metrics.probe"
    folds: int
    inner_folds: int
    Cs: Sequence[float]
    max_iter: int


@dataclass(frozen=True)
class MetricsSettings(FromConfig):
    """The ``metrics`` section, typed: ``MetricsSettings.from_config(config["metrics"])`` fills
    what a partial section leaves out, at every depth, from the schema."""

    SECTION: ClassVar[str] = "metrics"
    layers: str
    reference: ReferenceSettings
    readouts: ReadoutSettings
    geometry: GeometrySettings
    probe: ProbeSettings


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
    """Semantic checks of ``metrics`` (registered in ``repdiag.binding.config_checks()``).

    Neighbourhood sizes must fit in the reference set, the local PCA dimension below its k, and
    the probe folds within each Same/Different class (``datasets.binding.n_pairs / 2``), and the
    inner folds of the C search within each class of an outer training fold.
    """
    settings = MetricsSettings.from_config(config.get("metrics") or {})
    max_size = settings.reference.max_size
    known = _binding_sizes(config)
    sets = settings.reference.image_sets
    folder = (config.get("embeddings") or {}).get("folder")
    if "folder" in sets and not folder:
        raise ConfigError(
            "metrics.reference.image_sets: 'folder' needs embeddings.folder (a folder of natural "
            "images) set; without it the embeddings have no such image set"
        )
    if all(name in known for name in sets):
        max_size = min(max_size, sum(known[name] for name in sets))
    where = f"the reference set (at most {max_size} embeddings)"
    for k in settings.geometry.l_iso_k:
        if k >= max_size:
            raise ConfigError(
                f"metrics.geometry.l_iso_k: k={k} needs more than k points in {where}"
            )
    readouts = settings.readouts
    for name, part in (("knn", readouts.knn), ("local_pca", readouts.local_pca)):
        if name in readouts.names and part.k > max_size:
            raise ConfigError(f"metrics.readouts.{name}.k={part.k} exceeds {where}")
    if readouts.local_pca.dim >= readouts.local_pca.k:
        raise ConfigError(
            f"metrics.readouts.local_pca.dim={readouts.local_pca.dim} must be below "
            f"metrics.readouts.local_pca.k={readouts.local_pca.k}"
        )
    n_pairs = config.get("datasets", {}).get("binding", {}).get("n_pairs")
    folds = settings.probe.folds
    if isinstance(n_pairs, int) and folds > n_pairs // 2:
        raise ConfigError(
            f"metrics.probe.folds={folds} exceeds the {n_pairs // 2} pairs of each "
            "Same/Different class (datasets.binding.n_pairs / 2)"
        )
    inner = settings.probe.inner_folds
    if isinstance(n_pairs, int):
        per_class = n_pairs // 2
        training = per_class - -(-per_class // folds)  # fewest per class in an outer training fold
        if inner > training:
            raise ConfigError(
                f"metrics.probe.inner_folds={inner} exceeds the {training} pairs of each "
                f"Same/Different class in an outer training fold (datasets.binding.n_pairs / 2 "
                f"= {per_class} minus one of metrics.probe.folds={folds} test folds)"
            )

"""The ``jacobians`` config section: the engine's settings read from it, and the checks JSON
schema cannot express. Defaults live in the schema only (schemas/jacobians.schema.yaml), filled in
by :mod:`repdiag.core.config`; nothing here repeats one.

Kept free of heavy imports: the Snakefile runs :func:`check_jacobians_config` on every parse.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from repdiag.core.errors import ConfigError

TAP_NAME = re.compile(r"\A(block\d{2,}|stage\d+|final|head)\Z")
"""Every tap name an encoder can have (repdiag.encoders.taps): ``block00``, ``block01``, ...
(transformer blocks), ``stage0``, ``stage1``, ... (CNN stages), ``final``, ``head``."""

TAP_NAMES_TEXT = (
    "taps are named block00, block01, ... (transformer blocks), stage0, stage1, ... (CNN "
    "stages), final (the model's embedding) and head (a projection after it)"
)


def engine_options(jacobians: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of :func:`~repdiag.encoders.jacobian.engine.jacobian_spectra` (``method``,
    ``k``, ``power_iters``, ``seed``, ``batch_size``, ``precision``) from a resolved ``jacobians``
    section (defaults filled from the schema)."""
    return {
        "method": jacobians["method"],
        "k": int(jacobians["k"]),
        "power_iters": int(jacobians["power_iters"]),
        "seed": int(jacobians["seed"]),
        "batch_size": jacobians["batch_size"],
        "precision": str(jacobians["precision"]),
    }


def probe_counts(jacobians: Mapping[str, Any]) -> dict[str, int]:
    """Images per probe set that will be used (0 for a skipped set; folder: at most n)."""
    probes = jacobians.get("probes", {})
    folder = probes.get("folder", {})
    return {
        "binding": int(probes.get("binding", {}).get("n", 0)),
        "noise": int(probes.get("noise", {}).get("n", 0)),
        "folder": int(folder.get("n", 0)) if folder.get("path") else 0,
    }


def probe_folder(jacobians: Mapping[str, Any]) -> str | None:
    """The image folder the probes read (``probes.folder.path``), or None when they take none
    from it (``probes.folder.n`` is 0): the rule's input and its digest both follow this."""
    folder = jacobians["probes"]["folder"]
    return folder["path"] if folder["n"] > 0 else None


def check_jacobians_config(config: Mapping[str, Any]) -> None:
    """Semantic checks of ``jacobians`` (registered in ``repdiag.encoders.CONFIG_CHECKS``).

    At least one probe image; tap names of the form every encoder's taps take (which taps a
    model has is checked before a run, by building it on the meta device); no more binding
    probes than rendered queries.
    """
    jacobians = config.get("jacobians") or {}
    counts = probe_counts(jacobians)
    if sum(counts.values()) == 0:
        raise ConfigError(
            "jacobians.probes: every probe set is empty; set jacobians.probes.binding.n, "
            "jacobians.probes.noise.n or jacobians.probes.folder.path and .n"
        )
    folder = (jacobians.get("probes") or {}).get("folder") or {}
    if counts["folder"] and not Path(folder["path"]).expanduser().is_dir():
        raise ConfigError(
            f"jacobians.probes.folder.path: {folder['path']} is not a folder; give a folder of "
            "images (relative paths are relative to the workflow directory) or set it to null"
        )
    for index, name in enumerate(jacobians.get("layers") or []):
        if not TAP_NAME.match(str(name)):
            raise ConfigError(
                f"jacobians.layers[{index}]: {name!r} is not a tap any encoder has; "
                f"{TAP_NAMES_TEXT}; or give [] for every tap"
            )
    n_queries = config.get("datasets", {}).get("binding", {}).get("n_queries")
    if isinstance(n_queries, int) and counts["binding"] > n_queries:
        raise ConfigError(
            f"jacobians.probes.binding.n = {counts['binding']} exceeds datasets.binding.n_queries "
            f"= {n_queries}: lower it or render more queries"
        )


def chunks_per_call(batch_size: int, k: int, chunk_size: int) -> int:
    """Whole chunks per engine call: as many as one randomized pass of ``batch_size`` products
    holds (``batch_size // k`` images), at least one. Exact taps are split further by the engine
    (``batch_size // d`` images per pass)."""
    return max(1, max(1, batch_size // k) // chunk_size)

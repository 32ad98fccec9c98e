"""The ``jacobians`` config section: the engine's settings read from it, and the checks JSON
schema cannot express. Defaults live in the schema only (schemas/jacobians.schema.yaml), filled in
by :mod:`repdiag.core.config`; nothing here repeats one.

Kept free of heavy imports: the Snakefile runs :func:`check_jacobians_config` on every parse.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from repdiag.core.errors import ConfigError
from repdiag.core.settings import FromConfig

TAP_NAME = re.compile(r"\A(block\d{2,}|stage\d+|final|head)\Z")
"""Every tap name an encoder can have (repdiag.encoders.taps): ``block00``, ``block01``, ...
(transformer blocks), ``stage0``, ``stage1``, ... (CNN stages), ``final``, ``head``."""

TAP_NAMES_TEXT = (
    "taps are named block00, block01, ... (transformer blocks), stage0, stage1, ... (CNN "
    "stages), final (the model's embedding) and head (a projection after it)"
)


ENGINE_KEYS = ("method", "k", "power_iters", "seed", "batch_size", "precision")
"""The keys of the section :func:`~repdiag.encoders.jacobian.engine.jacobian_spectra` takes, as
keyword arguments of the same names."""


@dataclasses.dataclass(frozen=True)
class JacobianSettings(FromConfig):
    """The ``jacobians`` section, typed: built once from the validated config
    (``JacobianSettings.from_config(config["jacobians"])``, which takes a key the section leaves
    out from schemas/jacobians.schema.yaml, the one home of every default and bound), then
    passed whole. Each key keeps its config name down to the engine's keyword of that name."""

    SECTION: ClassVar[str] = "jacobians"
    method: str
    k: int
    power_iters: int
    seed: int
    batch_size: int | None
    precision: str
    chunk_size: int
    layers: list[str]
    formulas: list[str]
    probes: Mapping[str, Any]

    def engine(self) -> dict[str, Any]:
        """The engine's keyword settings (:data:`ENGINE_KEYS`), under their config names."""
        return {key: getattr(self, key) for key in ENGINE_KEYS}

    def probe_counts(self) -> dict[str, int]:
        """Images per probe set that will be used (0 for a skipped set; folder: at most n, none
        without a path)."""
        folder = self.probes["folder"]
        return {
            "binding": self.probes["binding"]["n"],
            "noise": self.probes["noise"]["n"],
            "folder": folder["n"] if folder["path"] else 0,
        }

    def probe_folder(self) -> str | None:
        """The image folder the probes read (``probes.folder.path``), or None when they take
        none from it (``probes.folder.n`` is 0): the rule's input and its digest follow this."""
        folder = self.probes["folder"]
        return folder["path"] if folder["n"] > 0 else None


def check_jacobians_config(config: Mapping[str, Any]) -> None:
    """Semantic checks of ``jacobians`` (registered in ``repdiag.encoders.config_checks()``).

    At least one probe image; tap names of the form every encoder's taps take (which taps a
    model has is checked before a run, by building it on the meta device); no more binding
    probes than rendered queries.
    """
    jacobians = JacobianSettings.from_config(config.get("jacobians") or {})
    counts = jacobians.probe_counts()
    if sum(counts.values()) == 0:
        raise ConfigError(
            "jacobians.probes: every probe set is empty; set jacobians.probes.binding.n, "
            "jacobians.probes.noise.n or jacobians.probes.folder.path and .n"
        )
    folder = jacobians.probes["folder"]
    if counts["folder"] and not Path(folder["path"]).expanduser().is_dir():
        raise ConfigError(
            f"jacobians.probes.folder.path: {folder['path']} is not a folder; give a folder of "
            "images (relative paths are relative to the workflow directory) or set it to null"
        )
    for index, name in enumerate(jacobians.layers):
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

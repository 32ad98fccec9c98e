"""Pre-run checks of the binding config that need built models (``repdiag.binding.build_checks()``).

Run by ``repdiag validate`` and a real run's ``onstart`` (``repdiag.core.checks.check_before_run``),
not on every parse. Light to import: the encoder factory, which builds models on the meta device,
is imported only when there is something to check.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from repdiag.core.errors import ConfigError

TAPS_CHECKED_SOURCES = frozenset({"zoo", "timm", "checkpoint", "torchvision", "open_clip"})
"""Sources whose taps are known by building the architecture from library code; a python or hub
entry would run the user's code to be built, so its taps are its job's to check."""


def check_jacobian_layers(config: Mapping[str, Any], models: Collection[str] | None = None) -> None:
    """Every name of ``jacobians.layers`` is a tap of each of ``models`` (default: every model)
    from a source of :data:`TAPS_CHECKED_SOURCES`, built on the meta device (no weights read).
    A model that cannot be built here is left to its job, which reports it."""
    layers = [str(name) for name in ((config.get("jacobians") or {}).get("layers") or [])]
    entries = config.get("models") or {}
    keys = [
        key
        for key, entry in entries.items()
        if (models is None or key in models) and entry.get("source") in TAPS_CHECKED_SOURCES
    ]
    if not layers or not keys:
        return
    from repdiag.encoders.factory import build_encoder

    default_pooling = config["embeddings"]["pooling"]
    for key in keys:
        try:
            encoder = build_encoder(
                key, entries[key], default_pooling=default_pooling, meta=True, config=config
            )
        except Exception:  # not this check's error: the model's job reports it
            continue
        missing = [name for name in layers if name not in encoder.layers]
        if missing:
            raise ConfigError(
                f"jacobians.layers: {', '.join(map(repr, missing))} not among the taps of model "
                f"{key!r} ({encoder.origin}): {', '.join(encoder.layers)}; name taps every model "
                "has, or give [] for every tap"
            )

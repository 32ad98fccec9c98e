"""Encoders: one registry of sources (timm, open_clip, torchvision, hub, checkpoint, zoo, python),
per-layer taps, embedding extraction, and the Jacobian spectra of the taps with their cost planner
(:mod:`repdiag.encoders.jacobian`).

Public API::

    from repdiag.encoders import build_encoder, layer_outputs

    enc = build_encoder("vit", {"source": "timm", "id": "vit_small_patch16_224", "family": "supervised"})
    feats = enc.layer_outputs(enc.preprocess(uint8_images))   # {"block00": (N, D), ..., "final": ...}

Imports are lazy so that the Snakefile can read ``repdiag.encoders.entries`` without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from repdiag.encoders.factory import Encoder, build_encoder
    from repdiag.encoders.sources import SOURCES
    from repdiag.encoders.taps import layer_outputs

__all__ = ["SOURCES", "Encoder", "build_encoder", "layer_outputs"]

CONFIG_CHECKS: tuple[str, ...] = (
    "repdiag.encoders.entries:check_models",
    "repdiag.encoders.entries:check_embeddings_config",
    "repdiag.encoders.zoo.spec:check_zoo_config",
    "repdiag.encoders.jacobian.options:check_jacobians_config",
)
"""This study's cross-key config checks ("module:function"), run by core.config.check_config."""

BUILD_CHECKS: tuple[str, ...] = (
    "repdiag.encoders.zoo.prerun:check_zoo_backbones",
    "repdiag.encoders.factory:check_model_sizes",
)
"""Pre-run checks that build architectures on the meta device (core.checks.check_before_run)."""

WEIGHTS_CHECKS: tuple[str, ...] = ("repdiag.encoders.available:check_weights_available",)
"""Pre-run checks of weights files, hub folders and library caches (core.checks.check_before_run)."""

_WHERE = {
    "SOURCES": "repdiag.encoders.sources",
    "Encoder": "repdiag.encoders.factory",
    "build_encoder": "repdiag.encoders.factory",
    "layer_outputs": "repdiag.encoders.taps",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'repdiag.encoders' has no attribute {name!r}")

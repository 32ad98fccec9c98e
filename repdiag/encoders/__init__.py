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
    from repdiag.core.checks import Check
    from repdiag.encoders.factory import Encoder, build_encoder
    from repdiag.encoders.sources import SOURCES
    from repdiag.encoders.taps import layer_outputs

__all__ = ["SOURCES", "Encoder", "build_encoder", "layer_outputs"]


def config_checks() -> tuple[Check, ...]:
    """This package's cross-key config checks, run by core.config.check_config (imported when
    asked: importing the package imports none of them)."""
    from repdiag.encoders.entries import check_embeddings_config, check_models
    from repdiag.encoders.jacobian.options import check_jacobians_config
    from repdiag.encoders.zoo.spec import check_zoo_config

    return (check_models, check_embeddings_config, check_zoo_config, check_jacobians_config)


def build_checks() -> tuple[Check, ...]:
    """Pre-run checks that build architectures on the meta device (core.checks.check_before_run)."""
    from repdiag.encoders.factory import check_model_sizes
    from repdiag.encoders.zoo.prerun import check_zoo_backbones

    return (check_zoo_backbones, check_model_sizes)


def weights_checks() -> tuple[Check, ...]:
    """Pre-run checks of weights files, hub folders and library caches (core.checks.check_before_run)."""
    from repdiag.encoders.available import check_weights_available

    return (check_weights_available,)


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

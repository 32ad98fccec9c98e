"""Contrastive learning: encoders, InfoNCE variants, training loops, the identifiability study.

Submodules are imported explicitly (``repdiag.identifiability.losses`` ...) so that the table and
figure code (:mod:`repdiag.identifiability.report`) runs without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repdiag.core.checks import Check


def config_checks() -> tuple[Check, ...]:
    """This package's cross-key config checks, run by core.config.check_config (imported when
    asked: importing the package imports none of them)."""
    from repdiag.identifiability.study import check_identifiability_config

    return (check_identifiability_config,)

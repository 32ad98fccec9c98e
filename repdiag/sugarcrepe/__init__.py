"""SugarCrepe: compositional image-text matching on natural images (data, scoring, report)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repdiag.core.checks import Check


def config_checks() -> tuple[Check, ...]:
    """This package's cross-key config checks, run by core.config.check_config (imported when
    asked: importing the package imports none of them)."""
    from repdiag.sugarcrepe.data import check_sugarcrepe_config

    return (check_sugarcrepe_config,)

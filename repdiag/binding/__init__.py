"""The binding study: controls (encoders whose binding score is known before any run)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from repdiag.common.families import (
    APART_FAMILIES,
    BINDING_DOSE_FAMILY,
    BINDING_SUPERVISED_FAMILY,
    CONTROL_FAMILY,
    JER_INTERVENTION_FAMILY,
)

if TYPE_CHECKING:
    from repdiag.core.checks import Check

__all__ = [
    "APART_FAMILIES",
    "BINDING_DOSE_FAMILY",
    "BINDING_SUPERVISED_FAMILY",
    "CONTROL_FAMILY",
    "JER_INTERVENTION_FAMILY",
    "build_checks",
    "config_checks",
]


def config_checks() -> tuple[Check, ...]:
    """This package's cross-key config checks, run by core.config.check_config (imported when
    asked: importing the package imports none of them)."""
    from repdiag.binding.analysis.options import check_stats_config
    from repdiag.binding.causal.options import check_causal_config
    from repdiag.binding.dataset import check_binding_config
    from repdiag.binding.family_options import check_family_config
    from repdiag.binding.metrics.options import check_metrics_config
    from repdiag.binding.replicate_options import check_replicate_config

    return (
        check_binding_config,
        check_metrics_config,
        check_stats_config,
        check_causal_config,
        check_family_config,
        check_replicate_config,
    )


def build_checks() -> tuple[Check, ...]:
    """Pre-run checks (core.checks.check_before_run): the controls against the dataset, then the
    Jacobian taps, which build architectures on the meta device."""
    from repdiag.binding.control_options import check_controls_config
    from repdiag.binding.prerun import check_jacobian_layers

    return (check_controls_config, check_jacobian_layers)

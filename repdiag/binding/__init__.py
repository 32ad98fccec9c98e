"""The binding study: controls (encoders whose binding score is known before any run)."""

from repdiag.common.families import (
    APART_FAMILIES,
    BINDING_DOSE_FAMILY,
    BINDING_SUPERVISED_FAMILY,
    CONTROL_FAMILY,
    JER_INTERVENTION_FAMILY,
)

__all__ = [
    "APART_FAMILIES",
    "BINDING_DOSE_FAMILY",
    "BINDING_SUPERVISED_FAMILY",
    "BUILD_CHECKS",
    "CONFIG_CHECKS",
    "CONTROL_FAMILY",
    "JER_INTERVENTION_FAMILY",
]

CONFIG_CHECKS: tuple[str, ...] = (
    "repdiag.binding.dataset:check_binding_config",
    "repdiag.binding.metrics.options:check_metrics_config",
    "repdiag.binding.analysis.options:check_stats_config",
    "repdiag.binding.causal.options:check_causal_config",
    "repdiag.binding.family_options:check_family_config",
    "repdiag.binding.replicate_options:check_replicate_config",
)
"""This study's cross-key config checks ("module:function"), run by core.config.check_config."""

BUILD_CHECKS: tuple[str, ...] = (
    "repdiag.binding.control_options:check_controls_config",
    "repdiag.binding.prerun:check_jacobian_layers",
)
"""Pre-run checks (core.checks.check_before_run): the controls against the dataset, then the
Jacobian taps, which build architectures on the meta device."""

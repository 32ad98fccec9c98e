"""The binding study: controls (encoders whose binding score is known before any run)."""

CONTROL_FAMILY = "control"
"""Family of the controls (``repdiag.binding.controls`` and zoo runs of 0 steps)."""
BINDING_SUPERVISED_FAMILY = "binding_supervised"
"""Family of zoo runs whose training signal states the benchmark's answer (per-slot shape labels,
captions with positions): upper bounds, not members of an objective family."""
APART_FAMILIES = (CONTROL_FAMILY, BINDING_SUPERVISED_FAMILY)
"""Shown apart from the objective families in tables and figures and kept out of every
correlation and fit across models."""

"""The binding study: controls (encoders whose binding score is known before any run)."""

CONTROL_FAMILY = "control"
"""Family of the controls (``repdiag.binding.controls`` and zoo runs of 0 steps): shown apart from
the objective families in tables and figures, and kept out of the correlations across models."""

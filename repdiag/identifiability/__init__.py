"""Contrastive learning: encoders, InfoNCE variants, training loops, the identifiability study.

Submodules are imported explicitly (``repdiag.identifiability.losses`` ...) so that the table and
figure code (:mod:`repdiag.identifiability.report`) runs without torch.
"""

CONFIG_CHECKS: tuple[str, ...] = ("repdiag.identifiability.study:check_identifiability_config",)
"""This study's cross-key config checks ("module:function"), run by core.config.check_config."""

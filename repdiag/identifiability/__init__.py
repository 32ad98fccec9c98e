"""Contrastive learning: encoders, InfoNCE variants, training loops, the identifiability study.

Submodules are imported explicitly (``repdiag.identifiability.losses`` ...) so that the table and
figure code (:mod:`repdiag.identifiability.report`) runs without torch.
"""

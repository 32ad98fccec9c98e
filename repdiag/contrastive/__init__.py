"""Contrastive learning: encoders, InfoNCE variants, training loops, the identifiability study.

Submodules are imported explicitly (``repdiag.contrastive.losses`` ...) so that the table and
figure code (:mod:`repdiag.contrastive.report`) runs without torch.
"""

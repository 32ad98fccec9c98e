"""Sparse autoencoders for the alignment study.

``topk`` (TopK SAE core), ``distances`` (sliced Wasserstein), ``optim`` (Adam), ``methods``
(independent, SAE-A, Crosscoder, USAE, CoSAE in the ``METHODS`` registry), ``train`` (the
training loop), ``grid`` (cells and per-job params, torch-free), ``study`` (running a cell or a
real pair), ``report`` (tables and claims), ``figures``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repdiag.core.checks import Check


def config_checks() -> tuple[Check, ...]:
    """This package's cross-key config checks, run by core.config.check_config (imported when
    asked: importing the package imports none of them)."""
    from repdiag.alignment.grid import check_alignment_config

    return (check_alignment_config,)

"""Sparse autoencoders for the alignment study.

``topk`` (TopK SAE core), ``distances`` (sliced Wasserstein), ``optim`` (Adam), ``methods``
(independent, SAE-A, Crosscoder, USAE, CoSAE in the ``METHODS`` registry), ``train`` (the
training loop), ``grid`` (cells and per-job params, torch-free), ``study`` (running a cell or a
real pair), ``report`` (tables and claims), ``figures``.
"""

CONFIG_CHECKS: tuple[str, ...] = ("repdiag.alignment.grid:check_alignment_config",)
"""This study's cross-key config checks ("module:function"), run by core.config.check_config."""

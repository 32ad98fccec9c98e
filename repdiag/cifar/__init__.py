"""SimCLR on CIFAR-10 across architectures and augmentation regimes.

The real-image check of "Loss is not enough" (``../shared/seeds/002``): SimCLR with a ResNet-18,
a ViT and an MLP under the regimes All, Crop only and All without crop, scored by linear-probe
accuracy. Submodules: :mod:`~repdiag.cifar.views` (regimes, two views), :mod:`~repdiag.cifar.encoders`,
:mod:`~repdiag.cifar.train` (NT-Xent training, features), :mod:`~repdiag.cifar.probe`,
:mod:`~repdiag.cifar.study` (runs from the config; no torch at import),
:mod:`~repdiag.cifar.report` (table and figure; no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repdiag.core.checks import Check


def config_checks() -> tuple[Check, ...]:
    """This package's cross-key config checks, run by core.config.check_config (imported when
    asked: importing the package imports none of them)."""
    from repdiag.cifar.study import check_cifar_config

    return (check_cifar_config,)

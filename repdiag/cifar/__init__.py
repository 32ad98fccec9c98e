"""SimCLR on CIFAR-10 across architectures and augmentation regimes.

The real-image check of "Loss is not enough" (``../shared/seeds/002``): SimCLR with a ResNet-18,
a ViT and an MLP under the regimes All, Crop only and All without crop, scored by linear-probe
accuracy. Submodules: :mod:`~repdiag.cifar.views` (regimes, two views), :mod:`~repdiag.cifar.encoders`,
:mod:`~repdiag.cifar.train` (NT-Xent training, features), :mod:`~repdiag.cifar.probe`,
:mod:`~repdiag.cifar.study` (runs from the config; no torch at import),
:mod:`~repdiag.cifar.report` (table and figure; no torch).
"""

CONFIG_CHECKS: tuple[str, ...] = ("repdiag.cifar.study:check_cifar_config",)
"""This study's cross-key config checks ("module:function"), run by core.config.check_config."""

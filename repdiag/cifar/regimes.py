"""The augmentation regimes of the CIFAR-10 study, defined once and selected by name (no torch).

A regime is a set of augmentation groups (built in :mod:`repdiag.cifar.views`):

- ``geometric``: random resized crop and horizontal flip (keys ``crop_scale``, ``crop_ratio``,
  ``flip_p`` of ``cifar.augment``): pixels move, colours are kept;
- ``photometric``: colour jitter, random grayscale, Gaussian blur (``jitter_*``, ``grayscale_p``,
  ``blur_*``): colours change, nothing moves.

The regimes of "Loss is not enough" (seed 002): ``all`` (both groups, the widest support of the
positive-pair distribution), ``crop_only`` (geometric) and ``no_crop`` ("All w/o crop":
photometric). Each regime reads only its groups' keys, so a run's parameters hold exactly those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from repdiag.core.errors import ConfigError
from repdiag.core.registry import Registry

AUGMENTATION_GROUPS: dict[str, tuple[str, ...]] = {
    "geometric": ("crop_scale", "crop_ratio", "flip_p"),
    "photometric": (
        "jitter_strength",
        "jitter_p",
        "grayscale_p",
        "blur_p",
        "blur_kernel",
        "blur_sigma",
    ),
}


@dataclasses.dataclass(frozen=True)
class Regime:
    """A regime: its name, its label in tables and figures, its augmentation groups (in order)."""

    name: str
    label: str
    groups: tuple[str, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        """The ``cifar.augment`` keys this regime reads."""
        return tuple(key for group in self.groups for key in AUGMENTATION_GROUPS[group])


REGIMES: Registry[Regime] = Registry("augmentation regime")
for _regime in (
    Regime("all", "All", ("geometric", "photometric")),
    Regime("crop_only", "Crop only", ("geometric",)),
    Regime("no_crop", "All w/o crop", ("photometric",)),
):
    REGIMES.add(_regime.name, _regime)


def regime_label(name: str) -> str:
    return REGIMES.get(name).label if name in REGIMES else name


def regime_settings(regime: str, augment: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of ``cifar.augment`` that ``regime`` reads (plain values)."""
    missing = [key for key in REGIMES.get(regime).keys if key not in augment]
    if missing:
        raise ConfigError(f"cifar.augment lacks {missing}, needed by regime {regime!r}")
    return {key: augment[key] for key in REGIMES.get(regime).keys}

"""Settings objects built from their config section one way: ``Settings.from_config(section)``.

A settings dataclass that inherits :class:`FromConfig` names its section (``SECTION``, for
errors) and the section's keys another consumer reads (``OTHERS_READ``, left out); every other
key must be one of its fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from repdiag.core.errors import ConfigError


class FromConfig:
    """Mixin of a settings dataclass: :meth:`from_config` builds it from its config section."""

    SECTION: ClassVar[str] = ""
    """The config path of the section, e.g. ``alignment.train``: errors name keys under it."""
    OTHERS_READ: ClassVar[tuple[str, ...]] = ()
    """Keys of the section that are not this object's (another consumer reads them)."""

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> Self:
        """``cls(**section)`` without ``OTHERS_READ``; a key that is no field is a ConfigError
        naming ``SECTION.key`` and the fields (an unnamed key keeps the field's default)."""
        fields = sorted(field.name for field in dataclasses.fields(cls))  # type: ignore[arg-type]
        values = {k: v for k, v in section.items() if k not in cls.OTHERS_READ}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ConfigError(
                f"unknown key {cls.SECTION}.{unknown[0]}: {cls.__name__} has "
                f"{', '.join(fields)}; remove the key or correct its name"
            )
        return cls(**values)

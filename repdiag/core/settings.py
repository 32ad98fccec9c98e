"""Settings objects built from their config section one way: ``Settings.from_config(section)``.

A settings dataclass that inherits :class:`FromConfig` names its section (``SECTION``, for
errors); every key must be one of its fields, and a key the section leaves out takes the
schema's default (:func:`schema_section`), so a field repeats no default of the schema's.
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

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> Self:
        """``cls(**section)`` over the schema's defaults for ``SECTION`` (the one place they are
        written); a key of ``section`` that is no field is a ConfigError naming ``SECTION.key``
        and the fields."""
        fields = sorted(field.name for field in dataclasses.fields(cls))  # type: ignore[arg-type]
        unknown = sorted(set(section) - set(fields))
        if unknown:
            raise ConfigError(
                f"unknown key {cls.SECTION}.{unknown[0]}: {cls.__name__} has "
                f"{', '.join(fields)}; remove the key or correct its name"
            )
        defaults = {k: v for k, v in schema_section(cls.SECTION).items() if k in fields}
        return cls(**(defaults | dict(section)))


def schema_section(path: str) -> dict[str, Any]:
    """The schema's defaults of config section ``path`` (dotted, e.g. ``cifar.train``); empty
    where the schema gives none."""
    from repdiag.core.config import schema_defaults

    top, *rest = path.split(".")
    section: Any = schema_defaults(top) if top else {}
    for key in rest:
        section = section.get(key) if isinstance(section, Mapping) else None
    return dict(section) if isinstance(section, Mapping) else {}

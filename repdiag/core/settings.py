"""Settings objects built from their config section one way: ``Settings.from_config(section)``.

A settings dataclass that inherits :class:`FromConfig` names its section (``SECTION``, for
errors); every key must be one of its fields, and a key the section leaves out takes the
schema's default (:func:`schema_section`), so a field repeats no default of the schema's. A field
whose type is itself a :class:`FromConfig` class is a subsection, built from its mapping the same
way (its own defaults filled), so a nested section is one object with typed parts.
"""

from __future__ import annotations

import dataclasses
import sys
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
        values = {key: _frozen(value) for key, value in (defaults | dict(section)).items()}
        for name, part in _subsections(cls).items():
            if isinstance(values.get(name), Mapping):
                values[name] = part.from_config(values[name])
        return cls(**values)

    def to_config(self) -> dict[str, Any]:
        """The section as a mapping again (subsections nested, tuples as the lists a config
        holds), in field order: what a job records as the settings it ran with."""
        return _thawed(dataclasses.asdict(self))  # type: ignore[call-overload]


def _frozen(value: Any) -> Any:
    """A config list as a tuple (at any depth), so that a frozen settings object holds no
    mutable list and compares equal to one built with tuples."""
    return tuple(_frozen(item) for item in value) if isinstance(value, list) else value


def _thawed(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _thawed(item) for key, item in value.items()}
    return [_thawed(item) for item in value] if isinstance(value, tuple) else value


def _subsections(cls: type) -> dict[str, type[FromConfig]]:
    """The fields of ``cls`` whose annotated type is a FromConfig class, by field name."""
    names = vars(sys.modules[cls.__module__])
    found = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        kind = names.get(field.type) if isinstance(field.type, str) else field.type
        if isinstance(kind, type) and issubclass(kind, FromConfig):
            found[field.name] = kind
    return found


ITEM = "*"
"""In a section path, one item of a mapping of named items (``zoo.objectives.*.jer_regulariser``:
the regulariser of any zoo run)."""


def schema_section(path: str) -> dict[str, Any]:
    """The schema's defaults of config section ``path`` (dotted, e.g. ``cifar.train``; ``*`` for
    an item of a mapping of named items, whose defaults are those of an item nobody named); empty
    where the schema gives none."""
    from repdiag.core.config import fill_defaults

    top, *rest = path.split(".")
    if not top:
        return {}
    keys = [_UNNAMED if key == ITEM else key for key in rest]
    config: dict[str, Any] = {top: {}}
    node = config[top]
    for key in keys[: _last_item(rest)]:
        node = node.setdefault(key, {})
    fill_defaults(config)
    section: Any = config[top]
    for key in keys:
        section = section.get(key) if isinstance(section, Mapping) else None
    return dict(section) if isinstance(section, Mapping) else {}


_UNNAMED = "\x00item"  # a name no config can give (names are checked against a pattern)


def _last_item(keys: list[str]) -> int:
    """How many leading keys to create so that every ``*`` item exists (0: none)."""
    return max((i + 1 for i, key in enumerate(keys) if key == ITEM), default=0)

"""JSON-schema validation of a config, with the schema's defaults set, from parsed-once schemas.

The same semantics as ``snakemake.utils.validate(config, schema)`` (Draft 2020-12, relative
``$ref``s resolved against the schema file, every ``default`` of a ``properties`` entry set
while validating, as in the jsonschema FAQ's ``extend_with_default``), without re-reading a
referenced schema file for each ``$ref``: Snakemake parses them with pure-Python YAML each time,
0.6-0.8 s of every Snakemake start and every :func:`repdiag.core.config.load_config` for
our 11 section files. Here they come from :func:`schema_file` (libyaml, once per process).
It also needs no Snakemake, so a machine with only the library can load a config. One check
is added: an ``integer`` key takes an int, not a float such as 32.0 (which JSON Schema admits).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import yaml

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"
"""The workflow's config schema; each section's schema file lies beside it."""


@functools.cache
def schema_file(path: Path) -> Mapping[str, Any]:
    """A schema file, parsed once per process (never changed: defaults are deep-copied); a
    Snakefile parse follows ~2,800 ``$ref``s, 2-3 s of every Snakemake start when reread."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.cache
def _with_defaults(validator_class: Any) -> Any:
    from jsonschema import validators

    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(
        validator: Any, properties: Mapping[str, Any], instance: Any, schema: Any
    ) -> Iterator[Any]:
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if isinstance(sub, Mapping) and "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(validator_class, {"properties": set_defaults})


def _retrieve(uri: str) -> Any:
    from referencing import Resource

    return Resource.from_contents(schema_file(Path(url2pathname(urlparse(uri).path)).resolve()))


def validate_config(config: Any, schema: Path = SCHEMA) -> None:
    """Validate ``config`` against ``schema`` (a YAML JSON-schema file), setting its defaults in
    place, then check that every ``integer`` key holds an int (:func:`strict_integers`); raises
    ``jsonschema.ValidationError`` (``repdiag.core.config.short_schema_errors`` turns it into one
    line naming the key)."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    path = Path(schema).resolve()
    contents = {**schema_file(path), "$id": path.as_uri()}  # relative $refs resolve to files
    registry = Registry(retrieve=_retrieve).with_resource(
        uri=path.as_uri(), resource=Resource.from_contents(contents)
    )
    _with_defaults(Draft202012Validator)(contents, registry=registry).validate(config)
    unversioned = Registry(retrieve=_retrieve_unversioned).with_resource(
        uri=path.as_uri(), resource=Resource.from_contents(contents)
    )
    strict_integers(Draft202012Validator)(contents, registry=unversioned).validate(config)


@functools.cache
def strict_integers(validator_class: Any) -> Any:
    """``validator_class`` whose ``integer`` is an int only. JSON Schema admits 32.0 as an
    integer, and a job given one fails deep in ``range()`` or a tensor's shape; with this check
    no reader converts an integer key again."""
    from jsonschema import validators

    integers = validator_class.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    )
    return validators.extend(validator_class, type_checker=integers)


def _retrieve_unversioned(uri: str) -> Any:
    """A section file without its ``$schema``: at a ``$ref`` jsonschema validates a file that
    names its dialect with that dialect's stock class, which would drop :func:`strict_integers`'
    checker (the first pass keeps Snakemake's semantics, whose defaults depend on that)."""
    from referencing.jsonschema import DRAFT202012

    contents = schema_file(Path(url2pathname(urlparse(uri).path)).resolve())
    return DRAFT202012.create_resource({k: v for k, v in contents.items() if k != "$schema"})

"""Config validation outside Snakemake and semantic checks the JSON schema cannot express."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from repdiag.errors import ConfigError

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"

# Checks across keys that JSON schema cannot state (e.g. more candidates than arrangements).
# Each is "module:function" taking the whole config and raising ConfigError naming the key.
SEMANTIC_CHECKS: tuple[str, ...] = (
    "repdiag.data.binding:check_binding_config",
    "repdiag.encoders.entries:check_models",
    "repdiag.encoders.entries:check_embeddings_config",
    "repdiag.encoders.zoo.spec:check_zoo_config",
    "repdiag.jacobian_options:check_jacobians_config",
    "repdiag.metrics.options:check_metrics_config",
    "repdiag.stats_options:check_stats_config",
    "repdiag.sae.grid:check_alignment_config",
    "repdiag.contrastive.study:check_identifiability",
    "repdiag.cifar.study:check_cifar_config",
    "repdiag.data.sugarcrepe:check_sugarcrepe_config",
)


class UniqueKeyLoader(yaml.SafeLoader):
    """A ``yaml.SafeLoader`` that refuses a mapping key given twice.

    PyYAML (and so Snakemake's ``--configfile``) silently keeps the last of two equal keys, so a
    model pasted twice under ``models`` would quietly drop the first entry. This loader raises a
    :class:`ConfigError` naming the file, the line, the key and the mapping that holds it.
    Merge keys (``<<: *anchor``) may still be overridden, as YAML intends.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        _reject_duplicate_keys(self, node, "", set())
        return super().construct_document(node)


def _reject_duplicate_keys(
    loader: yaml.SafeLoader, node: yaml.Node, where: str, walked: set[int]
) -> None:
    """Walk the composed ``node`` tree; raise at the second occurrence of a key in a mapping."""
    if id(node) in walked:  # an alias of a node already walked (or a recursive structure)
        return
    walked.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _reject_duplicate_keys(loader, item, f"{where}[{index}]", walked)
    elif isinstance(node, yaml.MappingNode):
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                _reject_duplicate_keys(loader, value_node, where, walked)
                continue
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                duplicate = key in first_line
            except TypeError:  # an unhashable key: SafeLoader reports it itself
                continue
            if duplicate:
                inside = f"in {where}" if where else "at the top level"
                raise ConfigError(
                    f"config file {loader.name} line {line}: duplicate key {key!r} {inside} "
                    f"(first on line {first_line[key]}); YAML would silently keep only the last "
                    "one: remove or rename one of them"
                )
            first_line[key] = line
            _reject_duplicate_keys(
                loader, value_node, f"{where}.{key}" if where else str(key), walked
            )


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML (or JSON) file like ``yaml.safe_load``, refusing duplicate mapping keys."""
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=UniqueKeyLoader)  # a SafeLoader: no arbitrary objects


def check_config_files(paths: Iterable[str | Path]) -> None:
    """Re-read the config files Snakemake loaded (``workflow.configfiles``) with :func:`load_yaml`.

    Snakemake parses them with a loader that keeps the last of two equal keys; this turns such a
    silent loss into an error before validation. A file YAML cannot parse was read by Snakemake as
    JSON and is left to it.
    """
    for path in paths:
        if Path(path).is_file():
            try:
                load_yaml(path)
            except yaml.YAMLError:
                continue


def _resolve(schema: Mapping[str, Any], base: Path) -> tuple[Mapping[str, Any], Path]:
    """Follow a relative-file ``$ref`` (the only kind our schemas use)."""
    while "$ref" in schema:
        target = (base / schema["$ref"]).resolve()
        schema, base = yaml.safe_load(target.read_text()), target.parent
    return schema, base


def fill_defaults(
    config: Any, schema: Mapping[str, Any] | None = None, base: Path | None = None
) -> Any:
    """Set every schema ``default`` missing from ``config``, following ``$ref`` into section files.

    ``snakemake.utils.validate`` fills defaults only in the top-level schema file; this completes
    the job for the per-stage schema files so that stages can rely on every key being present.
    """
    if schema is None:
        schema, base = yaml.safe_load(SCHEMA.read_text()), SCHEMA.parent
    schema, base = _resolve(schema, base)
    if isinstance(config, dict):
        for key, sub in schema.get("properties", {}).items():
            sub, sub_base = _resolve(sub, base)
            if key not in config and "default" in sub:
                config[key] = copy.deepcopy(sub["default"])
            if key in config:
                fill_defaults(config[key], sub, sub_base)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in config.items():
                if key not in schema.get("properties", {}):
                    fill_defaults(value, extra, base)
    elif isinstance(config, list) and isinstance(schema.get("items"), dict):
        for item in config:
            fill_defaults(item, schema["items"], base)
    return config


def check_config(config: Mapping[str, Any]) -> None:
    """Run the semantic checks; call after JSON-schema validation (the Snakefile does both)."""
    for target in SEMANTIC_CHECKS:
        module_name, func_name = target.split(":")
        getattr(importlib.import_module(module_name), func_name)(config)


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a YAML config and validate it with the workflow's own schema and checks."""
    from snakemake.utils import validate

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    config = load_yaml(path) or {}
    try:
        validate(config, str(SCHEMA))
    except Exception as err:
        raise ConfigError(f"{path}: {err}") from err
    fill_defaults(config)
    check_config(config)
    return config


def section(config: Mapping[str, Any], *keys: str) -> Any:
    """``config[k1][k2]...`` with an error naming the dotted key when one is missing."""
    node: Any = config
    for depth, key in enumerate(keys):
        if not isinstance(node, Mapping) or key not in node:
            raise ConfigError(f"config key {'.'.join(keys[: depth + 1])!r} is missing")
        node = node[key]
    return node

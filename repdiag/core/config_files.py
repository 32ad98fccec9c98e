"""Several config files read as one: what Snakemake's deep merge of ``--configfile a.yaml b.yaml``
must not do silently (:func:`check_repeated_entries`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from repdiag.core.config import SCHEMA, _resolve, load_yaml
from repdiag.core.errors import ConfigError


def named_entry_maps(
    schema: Mapping[str, Any] | None = None, base: Path | None = None, prefix: str = ""
) -> list[str]:
    """The dotted keys of the config's maps of named entries (``models``, ``zoo.backbones``,
    ``zoo.objectives``): objects whose schema takes any key and an object under each."""
    if schema is None:
        schema, base = yaml.safe_load(SCHEMA.read_text()), SCHEMA.parent
    schema, base = _resolve(schema, base)
    found = []
    extra = schema.get("additionalProperties")
    if prefix and isinstance(extra, Mapping) and _resolve(extra, base)[0].get("type") == "object":
        found.append(prefix)
    for key, sub in (schema.get("properties") or {}).items():
        found += named_entry_maps(sub, base, f"{prefix}.{key}" if prefix else key)
    return found


def _entries_at(data: Any, dotted: str) -> Mapping[str, Any]:
    for key in dotted.split("."):
        data = data.get(key) if isinstance(data, Mapping) else None
    return data if isinstance(data, Mapping) else {}


def check_repeated_entries(paths: Iterable[str | Path]) -> None:
    """Refuse two config files given together (``--configfile a.yaml b.yaml``) that both define
    one named entry (a model, a zoo backbone or run: :func:`named_entry_maps`), naming both files.

    Snakemake deep-merges the files, so a key of the first file's entry would survive into the
    second's (a ``weights:`` or ``kwargs`` the second never set); a user reading the second file
    expects its entry as written. Sections (``embeddings: {batch_size: 8}``) still merge.
    """
    first: dict[str, str] = {}
    for path in paths:
        if not Path(path).is_file():
            continue
        data = load_yaml(path)
        for dotted in named_entry_maps():
            for name in _entries_at(data, dotted):
                where = f"{dotted}.{name}"
                if where in first and first[where] != str(path):
                    raise ConfigError(
                        f"{where} is defined in two config files, {first[where]} and {path}; "
                        "Snakemake would merge the two entries key by key. Define it in one "
                        "file only (rename one of them)"
                    )
                first.setdefault(where, str(path))


def merged_config_files(
    workflow_files: Iterable[str | Path], command_line: Iterable[str | Path], replaced: bool
) -> list[str]:
    """The config files Snakemake merges into one config: the workflow's own (``configfile:``,
    ``workflow.configfiles``) and then the command line's (``--configfile``), or the command
    line's alone when they replace the workflow's (``replace-workflow-config``, as the shipped
    profiles set) or none was given."""
    cli = [str(path) for path in command_line]
    if cli and replaced:
        return cli
    return [str(path) for path in workflow_files if str(path) not in cli] + cli

"""tools/schema_docs.py: docs/configuration.md is the schemas' descriptions, and covers every key
of the default config."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

from repdiag.core.config import SCHEMA

_SPEC = importlib.util.spec_from_file_location(
    "schema_docs", Path(__file__).resolve().parents[1] / "tools" / "schema_docs.py"
)
schema_docs = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(schema_docs)


def test_the_configuration_page_is_generated_from_the_current_schemas():
    assert schema_docs.PAGE.read_text() == schema_docs.render(), (
        "docs/configuration.md is stale: run `make docs` (python tools/schema_docs.py)"
    )


def _paths(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path
            yield from _paths(value, path)


def _pattern(row_path: str) -> re.Pattern[str]:
    return re.compile(re.escape(row_path).replace(re.escape("<key>"), r"[^.]+") + r"\Z")


def test_every_key_of_the_default_config_has_a_row():
    """Each key path of config/config.yaml matches a row, or lies under a free-form row (``kwargs``)."""
    config = yaml.safe_load((SCHEMA.parent.parent / "config/config.yaml").read_text())
    documented = [row[0] for row in schema_docs.rows(yaml.safe_load(SCHEMA.read_text()), SCHEMA)]
    patterns = {path: _pattern(path) for path in documented}
    free_form = [
        patterns[path]
        for path in documented
        if not any(
            other.startswith(path + ".") or other.startswith(path + "[") for other in documented
        )
    ]
    missing = []
    for path in _paths(config):
        ancestors = [".".join(path.split(".")[:i]) for i in range(1, path.count(".") + 1)]
        if not any(p.match(path) for p in patterns.values()) and not any(
            f.match(a) for f in free_form for a in ancestors
        ):
            missing.append(path)
    assert not missing, missing

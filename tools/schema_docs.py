"""``docs/configuration.md`` generated from the JSON schemas' descriptions, so the two cannot drift.

Every key of ``config/config.yaml`` is one row: its path (``models.<key>.pooling``; ``[]`` for the
items of a list), type, default and description. ``python tools/schema_docs.py`` (``make docs``) rewrites
the page; a test fails when the page and the schemas disagree.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from repdiag.core.config import SCHEMA

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
HEADER = """# Configuration reference

Generated from `schemas/*.schema.yaml` by `python tools/schema_docs.py`; do not edit by hand
(a test compares the two). Every section rejects unknown keys. `<key>` stands for a name you
choose (a model key, a run name); `[]` for the items of a list. Defaults are filled in by
`repdiag.core.config.load_config`; cross-key checks (which the schema cannot state) run after it.
"""


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _resolve(node: Mapping[str, Any], base: Path) -> tuple[Mapping[str, Any], Path]:
    while isinstance(node, Mapping) and "$ref" in node:
        base = (base.parent / node["$ref"]).resolve()
        node = _load(base)
    return node, base


def _type(node: Mapping[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join("null" if v is None else f"`{v}`" for v in node["enum"])
    kind = node.get("type", "")
    if isinstance(kind, list):
        return " \\| ".join(kind)
    if kind == "array" and isinstance(node.get("items"), Mapping) and "type" in node["items"]:
        return f"array of {_type(node['items'])}"
    return str(kind)


def _default(node: Mapping[str, Any]) -> str:
    if "default" not in node:
        return ""
    text = json.dumps(node["default"])
    return f"`{text}`" if len(text) <= 40 else f"`{text[:37]}...`"


def _cell(text: Any) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def rows(node: Mapping[str, Any], base: Path, path: str = "") -> Iterator[tuple[str, ...]]:
    """``(key path, type, default, description)`` for ``node`` and everything under it."""
    node, base = _resolve(node, base)
    if path:
        yield path, _type(node), _default(node), _cell(node.get("description"))
    for name, child in (node.get("properties") or {}).items():
        yield from rows(child, base, f"{path}.{name}" if path else name)
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping) and (extra.get("properties") or extra.get("$ref")):
        yield from rows(extra, base, f"{path}.<key>")
    items = node.get("items")
    if isinstance(items, Mapping) and (items.get("properties") or items.get("$ref")):
        yield from rows(items, base, f"{path}[]")


def render(schema: Path = SCHEMA) -> str:
    """The whole page: one table per top-level section."""
    root = _load(schema)
    parts = [HEADER]
    for section, child in root["properties"].items():
        node, _ = _resolve(child, schema)
        parts.append(f"\n## `{section}`\n\n{_cell(node.get('description'))}\n")
        parts.append("\n| key | type | default | description |\n|---|---|---|---|\n")
        parts.extend(
            f"| `{p}` | {t} | {d} | {text} |\n" for p, t, d, text in rows(child, schema, section)
        )
    return "".join(parts)


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE}")

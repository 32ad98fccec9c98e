"""Each default lives in the schema only: no library signature or settings field of a section's
own package repeats the schema's default for a key of the same name.

The library is read as source (``ast``), not imported: every function's and method's keyword
defaults and every class's annotated field defaults. A default is a repeat when its name is a
key of one of the sections its package reads (:data:`HOME`) and its literal value is that key's
schema default (``None`` and booleans aside: they say "unset" or "off" far more often than they
copy a setting). The repeats found when this test was written are listed in
``tests/schema_default_repeats.txt`` (``path:name``), to be removed; the test fails on a new
one, and on a listed one that is gone (delete its line), so the list only shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from repdiag.core.config import schema_defaults

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "repdiag"
KNOWN = ROOT / "tests" / "schema_default_repeats.txt"

HOME: dict[str, tuple[str, ...]] = {
    "binding": ("stats", "metrics", "datasets", "binding_causal", "binding_families",
                "binding_replicate"),
    "identifiability": ("identifiability",),
    "alignment": ("alignment",),
    "cifar": ("cifar",),
    "sugarcrepe": ("sugarcrepe",),
    "encoders/zoo": ("zoo",),
    "encoders/jacobian": ("jacobians",),
    "encoders/embeddings.py": ("embeddings",),
}  # fmt: skip
"""The config sections each part of the library reads (its path under repdiag/)."""


def _leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for key, inner in value.items():
            yield from _leaves(inner, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), value


def _as_list(value: Any) -> Any:
    """A tuple default as the list the schema's YAML gives (``(5, 10)`` repeats ``[5, 10]``)."""
    return [_as_list(v) for v in value] if isinstance(value, tuple) else value


def _settable(value: Any) -> bool:
    return value is not None and not isinstance(value, bool)


def schema_leaves(sections: tuple[str, ...]) -> dict[str, list[Any]]:
    """{leaf key name: each schema default it has} over ``sections``."""
    out: dict[str, list[Any]] = {}
    for section in sections:
        for path, value in _leaves(schema_defaults(section)):
            if _settable(value):
                out.setdefault(path.rsplit(".", 1)[-1], []).append(value)
    return out


def _defaults(node: ast.AST) -> Iterator[tuple[str, ast.expr]]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        positional = args.posonlyargs + args.args
        defaulted = positional[len(positional) - len(args.defaults) :]
        yield from zip((a.arg for a in defaulted), args.defaults, strict=True)
        keywords = zip(args.kwonlyargs, args.kw_defaults, strict=True)
        yield from ((a.arg, d) for a, d in keywords if d is not None)
    elif isinstance(node, ast.ClassDef):
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign) and statement.value is not None:
                if isinstance(statement.target, ast.Name):
                    yield statement.target.id, statement.value


def repeats() -> set[str]:
    """``path:name`` of every default that repeats its section's schema default."""
    found = set()
    for prefix, sections in HOME.items():
        leaves = schema_leaves(sections)
        base = PACKAGE / prefix
        files = [base] if base.suffix == ".py" else sorted(base.rglob("*.py"))
        for path in files:
            for node in ast.walk(ast.parse(path.read_text())):
                for name, default in _defaults(node):
                    if name not in leaves:
                        continue
                    try:
                        value = ast.literal_eval(default)
                    except ValueError:
                        continue
                    if _settable(value) and _as_list(value) in leaves[name]:
                        found.add(f"{path.relative_to(ROOT)}:{name}")
    return found


def test_no_new_default_repeats_a_schema_default_and_the_known_list_only_shrinks():
    known = {line for line in KNOWN.read_text().splitlines() if line and not line.startswith("#")}
    found = repeats()
    assert not found - known, (
        "library defaults that repeat the schema's (the schema is their one home; take the "
        f"value from the resolved config instead): {sorted(found - known)}"
    )
    assert not known - found, (
        f"no longer repeated, delete from {KNOWN.name}: {sorted(known - found)}"
    )


def test_the_check_sees_a_repeat_put_back(tmp_path, monkeypatch):
    """Known breaks: a readout taking the schema's k = 10 as its own default is found, and a
    tuple that repeats the schema's list."""
    module = tmp_path / "repdiag" / "binding" / "planted.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "def knn(x, k: int = 10, seed: int = 5, l_iso_k=(5, 10, 20, 50)):\n    return x\n"
    )
    module_globals = globals()
    monkeypatch.setitem(module_globals, "ROOT", tmp_path)
    monkeypatch.setitem(module_globals, "PACKAGE", tmp_path / "repdiag")
    monkeypatch.setitem(module_globals, "HOME", {"binding": ("metrics",)})
    planted = {"repdiag/binding/planted.py:k", "repdiag/binding/planted.py:l_iso_k"}
    assert repeats() == planted  # seed 5 is not a default there

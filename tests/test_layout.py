"""The package's layout: studies over a shared core, no import cycles, tests that mirror it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "repdiag"
STUDIES = ("binding", "identifiability", "alignment", "cifar", "sugarcrepe")
SHARED = ("core", "common", "encoders")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Every repdiag module each module imports, at module level or inside a function."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("repdiag"):
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    graph[name].add(child if child in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in modules}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan 1972)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    assert _cycles(_imports(_modules())) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_is_in_a_study_or_the_shared_core():
    top = {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert top == set(STUDIES) | set(SHARED)
    assert [p.name for p in PACKAGE.glob("*.py")] == ["__init__.py"]


def test_the_shared_core_imports_no_study():
    graph = _imports(_modules())
    leaks = {
        (name, target)
        for name, targets in graph.items()
        if name.startswith(("repdiag.core", "repdiag.common"))
        for target in targets
        if target.startswith(tuple(f"repdiag.{study}" for study in STUDIES))
    }
    assert leaks == set()


# Modules whose tests live in another suite's file (the file must name the module).
TESTED_ELSEWHERE = {
    "core/inspect.py": "tests/core/test_cli.py",  # through `repdiag inspect`
    "encoders/heads.py": "tests/binding/test_jacobian.py",  # heads as Jacobian taps
    "encoders/preprocess.py": "tests/encoders/test_registry.py",  # per-source preprocessing
    "encoders/zoo/checkpoint.py": "tests/encoders/zoo/test_train.py",  # needs a trained run
    "encoders/zoo/heads.py": "tests/encoders/zoo/objectives/test_base.py",  # every objective's head
}


def test_tests_mirror_the_package_file_for_file():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py" or "__pycache__" in relative.parts:
            continue
        mirror = ROOT / "tests" / relative.parent / f"test_{path.name}"
        if relative.as_posix() in TESTED_ELSEWHERE:
            elsewhere = ROOT / TESTED_ELSEWHERE[relative.as_posix()]
            assert path.stem in elsewhere.read_text(), (relative, elsewhere)
            assert not mirror.exists(), f"{mirror} exists: drop {relative} from TESTED_ELSEWHERE"
        elif not mirror.is_file():
            missing.append(str(mirror.relative_to(ROOT)))
    assert missing == []


def test_each_study_package_has_a_test_folder():
    for study in (*STUDIES, *SHARED):
        assert any((ROOT / "tests" / study).glob("test_*.py")), study


def _resolve(dotted: str):
    import importlib

    module, _, attribute = dotted.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def test_string_references_that_no_import_checks_resolve():
    """The cross-key check registry, the lazy exports, the tap planner's class names and the
    CLI's study subcommands."""
    import importlib

    from repdiag import encoders
    from repdiag.core.config import CHECKED_PACKAGES, semantic_checks

    for reference in semantic_checks():
        assert callable(_resolve(reference)), reference
    # each study registers only its own checks, and every study with a config section has some
    for package in CHECKED_PACKAGES:
        for reference in importlib.import_module(package).CONFIG_CHECKS:
            assert reference.startswith(package + "."), reference
    assert {p.rsplit(".", 1)[1] for p in CHECKED_PACKAGES} == set(STUDIES) | {"encoders"}
    for name, module in encoders._WHERE.items():
        assert _resolve(f"{module}.{name}") is getattr(encoders, name)
    source = (PACKAGE / "encoders" / "taps.py").read_text()
    for qualified in {q for q in _quoted(source) if q.startswith("repdiag.")}:
        assert isinstance(_resolve(qualified), type), qualified
    # subcommands the core's CLI runs from a study, named so that the core imports no study
    from repdiag.core.cli import STUDY_COMMANDS, resolve

    for name, (reference, _) in STUDY_COMMANDS.items():
        assert callable(_resolve(reference)), (name, reference)
        assert resolve(reference) is _resolve(reference), name


def _quoted(source: str) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }

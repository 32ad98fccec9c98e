"""The package's layout: studies over a shared core, imports that only point down, no import
cycles, tests that mirror it."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from repdiag.studies import STUDIES

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "repdiag"
SHARED = ("core", "common", "encoders")
# Imports only point down: core (0) -> common (1) -> encoders (2) -> each study (3). Top-level
# modules (repdiag/*.py: the list of studies, the CLI) sit above everything and import anything.
LAYER = {**{name: layer for layer, name in enumerate(SHARED)}, **dict.fromkeys(STUDIES, 3)}
TOP_LEVEL = ("__init__.py", "api.py", "cli.py", "contracts.py", "studies.py")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of a module's syntax tree, parsed once per test process."""
    return tuple(ast.walk(ast.parse(path.read_text())))


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Every repdiag module each module imports, at module level or inside a function."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in _nodes(path):
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


def _references(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Every repdiag module or name each module refers to: its imports, and every string constant
    that starts with ``repdiag.<package>`` (an importlib reference such as ``"module:function"``
    imports it too, only later)."""
    graph = _imports(modules)
    named = re.compile(r"^repdiag\.\w+(\.\w+)*")
    for name, path in modules.items():
        for node in _nodes(path):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                match = named.match(node.value)
                if match:
                    graph[name].add(match.group(0))
    return graph


def _package(module: str) -> str:
    """``repdiag.binding.dataset`` -> ``binding``; ``repdiag`` (the root package) -> ``""``."""
    return module.split(".")[1] if "." in module else ""


def _violations(graph: dict[str, set[str]], top_level: set[str]) -> list[tuple[str, str, str]]:
    """``(module, target, why)`` for every reference that points up a layer or across to another
    study. A module may refer to its own package and to lower layers; a top-level module (and the
    root package, which every import runs) to anything, but nothing below refers to them; a
    package outside LAYER is an error."""
    found = []
    for name, targets in sorted(graph.items()):
        if name in top_level or name == "repdiag":
            continue
        own = _package(name)
        for target in sorted(targets):
            other = _package(target)
            if other == own:
                continue
            if target == "repdiag" or target in top_level:
                found.append((name, target, "up: a top-level module"))
            elif other not in LAYER or own not in LAYER:
                found.append((name, target, "a package outside the layers"))
            elif LAYER[other] > LAYER[own]:
                found.append((name, target, f"up: layer {LAYER[own]} -> {LAYER[other]}"))
            elif LAYER[other] == LAYER[own]:
                found.append((name, target, "across: one study to another"))
    return found


def _top_level(modules: dict[str, Path]) -> set[str]:
    return {name for name, path in modules.items() if path.parent == PACKAGE}


def test_imports_only_point_down():
    modules = _modules()
    assert _violations(_references(modules), _top_level(modules)) == []


def test_the_layer_checker_finds_an_up_import_and_an_across_import():
    graph = {
        "repdiag.core.config": {"repdiag.core.errors", "repdiag.binding"},  # up, by a string
        "repdiag.common.figures": {"repdiag.core.config"},
        "repdiag.encoders.taps": {"repdiag.common.figures", "repdiag.studies"},  # up: top level
        "repdiag.binding.dataset": {"repdiag.encoders.taps", "repdiag.binding.plots"},
        "repdiag.sugarcrepe.report": {"repdiag.binding.dataset"},  # across
        "repdiag.studies": {"repdiag.binding", "repdiag.sugarcrepe.report"},
        "repdiag.core.store": {"repdiag"},  # the root package (its __version__, before)
    }
    assert _violations(graph, {"repdiag.studies"}) == [
        ("repdiag.core.config", "repdiag.binding", "up: layer 0 -> 3"),
        ("repdiag.core.store", "repdiag", "up: a top-level module"),
        ("repdiag.encoders.taps", "repdiag.studies", "up: a top-level module"),
        ("repdiag.sugarcrepe.report", "repdiag.binding.dataset", "across: one study to another"),
    ]


def test_string_references_count_as_imports():
    modules = _modules()
    graph = _references(modules)
    assert "repdiag.binding.dataset" in graph["repdiag.binding"]  # config_checks()
    assert "repdiag.encoders" in graph["repdiag.studies"]  # CHECKED_PACKAGES


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for other in graph.get(todo.pop(), ()):
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return seen


def test_the_jacobian_jobs_pass_sizing_builds_no_encoder():
    """The GPU job sizes its passes from one model's counted memory (plan_costs), never through
    the config planner, which builds encoders from config entries."""
    graph = _imports(_modules())
    for runtime in ("repdiag.encoders.jacobian.cache", "repdiag.encoders.jacobian.pass_size"):
        reached = _reachable(graph, runtime)
        assert "repdiag.encoders.jacobian.plan_costs" in reached
        assert not reached & {"repdiag.encoders.jacobian.plan_project", "repdiag.encoders.factory"}


def test_no_import_cycles():
    assert _cycles(_imports(_modules())) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_is_in_a_study_or_the_shared_core():
    top = {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert top == set(STUDIES) | set(SHARED)
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == sorted(TOP_LEVEL)


# Modules whose tests live in another suite's file (the file must name the module).
TESTED_ELSEWHERE = {
    "core/inspect.py": "tests/test_cli.py",  # through `repdiag inspect`
    "encoders/heads.py": "tests/encoders/jacobian/test_engine.py",  # heads as Jacobian taps
    "encoders/preprocess.py": "tests/encoders/test_factory.py",  # per-source preprocessing
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
    CLI's subcommands from packages."""
    import importlib

    from repdiag import encoders
    from repdiag.core.checks import resolve, semantic_checks
    from repdiag.studies import CHECKED_PACKAGES, COMMANDS

    checks = semantic_checks()
    assert len(set(checks)) == len(checks)  # no check registered twice
    # each study registers only its own checks, and every study with a config section has some
    for package in CHECKED_PACKAGES:
        checks = importlib.import_module(package).config_checks()
        assert checks and all(c.__module__.startswith(package + ".") for c in checks), package
    assert {p.rsplit(".", 1)[1] for p in CHECKED_PACKAGES} == set(STUDIES) | {"encoders"}
    for name, module in encoders._WHERE.items():
        assert _resolve(f"{module}.{name}") is getattr(encoders, name)
    source = (PACKAGE / "encoders" / "taps.py").read_text()
    for qualified in {q for q in _quoted(source) if q.startswith("repdiag.")}:
        assert isinstance(_resolve(qualified), type), qualified
    # subcommands the CLI runs from a package, named so that nothing imports them before they run
    for name, (reference, _) in COMMANDS.items():
        assert callable(_resolve(reference)), (name, reference)
        assert resolve(reference) is _resolve(reference), name


def _quoted(source: str) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _oversized(paths: list[Path], root: Path) -> list[str]:
    """Modules over MAX_MODULE_LINES lines and functions (methods and nested ones included) over
    MAX_FUNCTION_LINES, decorators and docstrings counted, as ``path[:line] [name]: lines``."""
    found = []
    for path in paths:
        source = path.read_text()
        name = path.relative_to(root).as_posix()
        if source.count("\n") > MAX_MODULE_LINES:
            found.append(f"{name}: {source.count(chr(10))}")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = node.end_lineno - start + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{start} {node.name}: {length}")
    return found


def test_no_module_over_500_lines_and_no_function_over_80():
    paths = sorted(PACKAGE.rglob("*.py"))
    paths += [
        *sorted((ROOT / "workflow_scripts").glob("*.py")),
        *(ROOT / "benchmarks").glob("*.py"),
    ]
    assert _oversized(sorted(paths), ROOT) == []


def test_the_size_checker_finds_a_long_function_and_a_long_module(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    path = tmp_path / "long.py"
    path.write_text(f"def short():\n    return 1\n\n\n@staticmethod\ndef long():\n{body}\n")
    assert _oversized([path], tmp_path) == [f"long.py:5 long: {MAX_FUNCTION_LINES + 1}"]
    path.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert _oversized([path], tmp_path) == [f"long.py: {MAX_MODULE_LINES + 1}"]


def _misplaced_imports(source: str) -> list[str]:
    """Imports of a workflow script that break the adapter shape: at the top only the standard
    library and ``repdiag.core`` (no torch: what the ``with`` line needs); inside the
    ``script_logging`` block everything else, so the job's threads are capped before torch starts
    and an import error is written to the job's log."""
    import sys

    def light(node: ast.Import | ast.ImportFrom) -> bool:
        modules = (
            [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        )
        return all(
            m.split(".")[0] in sys.stdlib_module_names or m.startswith("repdiag.core")
            for m in modules
        )

    tree = ast.parse(source)
    found = [
        f"{node.lineno}: top-level import of {ast.unparse(node)!r}"
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom) and not light(node)
    ]
    for block in (node for node in tree.body if isinstance(node, ast.With)):
        found += [
            f"{node.lineno}: {ast.unparse(node)!r} belongs at the top"
            for node in ast.walk(block)
            if isinstance(node, ast.Import | ast.ImportFrom) and light(node)
        ]
    return found


def test_workflow_scripts_import_the_library_inside_script_logging():
    found = {
        path.name: _misplaced_imports(path.read_text())
        for path in sorted((ROOT / "workflow_scripts").glob("*.py"))
    }
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_every_workflow_script_ends_with_exit_job_after_its_script_logging_block():
    """The job's last statement skips the interpreter's teardown (repdiag.core.runtime.exit_job);
    a script that raised inside its block never reaches it and fails as before."""
    shapes = {}
    for path in sorted((ROOT / "workflow_scripts").glob("*.py")):
        *_, block, last = ast.parse(path.read_text()).body
        shapes[path.name] = (type(block).__name__, ast.unparse(last))
    assert {name: shape for name, shape in shapes.items() if shape != ("With", "exit_job()")} == {}


def test_the_import_checker_finds_a_heavy_import_at_the_top_and_a_light_one_inside():
    source = (
        "import torch\nimport os, numpy\nfrom repdiag.core.runtime import script_logging\n"
        "with script_logging(None) as log:\n    import os\n    from repdiag.binding import x\n"
    )
    assert _misplaced_imports(source) == [
        "1: top-level import of 'import torch'",
        "2: top-level import of 'import os, numpy'",
        "5: 'import os' belongs at the top",
    ]


def _dangling(text: str) -> set[str]:
    """Dotted ``repdiag.…`` names in ``text`` that import nothing: the longest importable module
    prefix, then attributes; a name whose module imports but lacks the attribute is dangling."""
    import importlib

    found = set()
    for reference in set(re.findall(r"repdiag(?:\.\w+)+", text)):
        parts = reference.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                target = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attribute in parts[cut:]:
                target = getattr(target, attribute, None)
            if target is None:
                found.add(reference)
            break
    return found


def test_docs_rules_and_schemas_name_only_code_that_exists():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += [*sorted((ROOT / "rules").rglob("*.smk")), *sorted((ROOT / "schemas").glob("*.yaml"))]
    pages += [ROOT / "tests" / "reliability" / "README.md"]
    dangling = {str(p.relative_to(ROOT)): _dangling(p.read_text()) for p in pages}
    assert {page: names for page, names in dangling.items() if names} == {}
    assert _dangling("repdiag.binding.report and repdiag.core.config.nothing") == {
        "repdiag.binding.report",
        "repdiag.core.config.nothing",
    }


def test_the_readme_is_a_guide_of_at_most_12_kb_that_links_every_page():
    """Results beyond the headline rows live on the study pages (docs/<study>.md), each of
    which the README's table of pages links."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12_000
    table = readme[readme.index("## Where to read more") :]
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    assert [page for page in pages if f"]({page})" not in table] == []

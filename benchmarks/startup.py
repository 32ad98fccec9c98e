"""Per-job start-up and exit: a workflow script's imports and its ending at a baseline commit
against this checkout.

A Snakemake ``script:`` job starts a new interpreter, loads Snakemake's script preamble and runs
the script's imports before it does any work, and the interpreter's teardown after it. This
benchmark measures exactly that (the imports at module level and inside ``script_logging``,
plus ``snakemake.script``, for the extraction and Jacobian scripts their first ``numerics``
block, which imported torch._inductor, and the script's ending: ``exit_job()`` where the script
calls it, else the interpreter's normal exit) for chosen scripts, in fresh processes that alternate between a baseline tree (``git archive``
of ``--baseline``) and this checkout, and prints the median wall and CPU seconds of each and
their ratio. CPU seconds (user + system of the child) move less with the machine's load than wall
seconds; run it on a quiet machine and check ``uptime`` first.

    .venv/bin/python benchmarks/startup.py --baseline b8695dd --repeat 7
"""

from __future__ import annotations

import argparse
import ast
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = (
    "binding_plot_metric_scatter",
    "binding_stats_tables",
    "binding_aggregate_models",
    "binding_jacobian_spectra",
    "binding_extract_embeddings",
)
# What a script runs once before its first tensor operation, beyond its imports: the numerical
# switches block (repdiag.core.gpu.numerics) of the extraction and Jacobian jobs.
FIRST_CALLS = {
    "binding_jacobian_spectra": "from repdiag.core.gpu import numerics\nwith numerics('fp32', 'cpu'): pass",
    "binding_extract_embeddings": "from repdiag.core.gpu import numerics\nwith numerics('fp32', 'cpu'): pass",
}


def script_path(tree: Path, name: str) -> Path:
    """``workflow_scripts/NAME.py`` of ``tree``; in trees before the binding study's scripts took
    their prefix, the unprefixed name."""
    path = tree / "workflow_scripts" / f"{name}.py"
    if not path.exists() and name.startswith("binding_"):
        path = path.with_name(name.removeprefix("binding_") + ".py")
    return path


def script_imports(path: Path) -> str:
    """Every import statement a script runs before its work: module level and inside ``with``."""
    lines = ["import snakemake.script"]  # what the job's preamble loads to unpickle its object
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            lines.append(ast.unparse(node))
        elif isinstance(node, ast.With):
            lines += [
                ast.unparse(n) for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)
            ]
    return "\n".join(lines)


def script_ending(path: Path) -> str:
    """How the script ends: ``exit_job()`` (no interpreter teardown) where its last statement
    calls it, else nothing (the normal exit)."""
    last = ast.parse(path.read_text()).body[-1]
    if ast.unparse(last) == "exit_job()":
        return "from repdiag.core.runtime import exit_job\nexit_job()"
    return ""


def baseline_tree(ref: str, into: Path) -> Path:
    """The files of commit ``ref`` under ``into`` (no checkout, no git state)."""
    archive = subprocess.run(["git", "archive", ref], cwd=REPO, capture_output=True, check=True)
    with tempfile.TemporaryFile() as handle:
        handle.write(archive.stdout)
        handle.seek(0)
        with tarfile.open(fileobj=handle) as tar:
            tar.extractall(into, filter="data")
    return into


def one_start(tree: Path, code: str) -> tuple[float, float]:
    """(wall s, CPU s) of one interpreter running ``code`` with ``tree`` first on its path."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=tree,  # sys.path[0] is the tree: its repdiag, not the installed checkout's
        check=True,
        env={"PYTHONPATH": str(tree), "MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin"},
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="b8695dd", help="commit to compare against")
    parser.add_argument("--repeat", type=int, default=5, help="starts per script and tree")
    parser.add_argument("--scripts", nargs="+", default=list(SCRIPTS))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"baseline": baseline_tree(args.baseline, Path(tmp)), "this": REPO}
        print(
            f"start-up and exit of a job: {args.baseline} against this checkout, {args.repeat} starts each"
        )
        print(
            "| script | baseline wall s | this wall s | baseline CPU s | this CPU s | CPU ratio |"
        )
        print("|---|---|---|---|---|---|")
        for name in args.scripts:
            codes = {
                k: "\n".join(
                    (
                        script_imports(script_path(t, name)),
                        FIRST_CALLS.get(name, ""),
                        script_ending(script_path(t, name)),
                    )
                )
                for k, t in trees.items()
            }
            runs: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
            for _ in range(args.repeat):  # alternate, so that load changes hit both alike
                for key, tree in trees.items():
                    runs[key].append(one_start(tree, codes[key]))
            wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
            cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
            print(
                f"| {name} | {wall['baseline']:.2f} | {wall['this']:.2f} | {cpu['baseline']:.2f} "
                f"| {cpu['this']:.2f} | {cpu['this'] / cpu['baseline']:.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

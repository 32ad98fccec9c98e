"""Shared fixtures. The workflow fixture runs Snakemake once per session on config/test.yaml."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repdiag.studies import register
from tests import timing
from tests.shared_runs import (
    SHARED_RUNS,
    build_shared,
    shared_root,
    start_background_builds,
    stop_background_builds,
    worker_id,
)

REPO = Path(__file__).resolve().parent.parent
WORKFLOW_PARTS = (
    "Snakefile",
    "rules",
    "workflow_scripts",
    "schemas",
    "config",
    "envs",
    "profiles",
    "report",
)

os.environ.setdefault("MPLBACKEND", "Agg")
# One OpenMP/BLAS thread in every process the tests start (benchmarks, CLI runs, Snakemake and
# its jobs): the workers already hold one core each, and an OpenMP team that spins on a core
# another process holds ran the tiny GPU benchmark 15x slower inside the suite than alone.
for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
os.environ.setdefault(
    "HF_HUB_OFFLINE", "1"
)  # tests never touch the network (timm/open_clip caches)
# The suite is an entry point like the Snakefile and the CLI: it registers the packages whose
# config checks run (tests/test_studies.py checks that nothing does so on import)
register()


def copy_workflow(dest: Path) -> Path:
    """Copy the workflow (not results, not the venv) into ``dest`` and return it."""
    dest.mkdir(parents=True, exist_ok=True)
    for part in WORKFLOW_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part)
        elif src.exists():
            shutil.copy2(src, dest / part)
    return dest


def snakemake_command(*args: str) -> list[str]:
    """The venv's snakemake on config/test.yaml with 2 cores, then ``args``."""
    exe = Path(sys.executable).with_name("snakemake")
    return [str(exe), "--cores", "2", "--configfile=config/test.yaml", *args]


def snakemake_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0", **(extra or {})}


def snakemake(
    workdir: Path,
    *args: str,
    check: bool = True,
    timeout: int = 1800,
    env: dict[str, str] | None = None,
    start_new_session: bool = False,
) -> subprocess.CompletedProcess:
    """Run the venv's snakemake in ``workdir`` on config/test.yaml; output captured as text.

    ``env`` adds variables to the environment; ``start_new_session`` makes Snakemake the leader
    of a new session (the fault-injection tests kill that session).
    """
    proc = subprocess.run(
        snakemake_command(*args),
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=snakemake_env(env),
        start_new_session=start_new_session,
    )
    if check and proc.returncode != 0:
        logs = (
            "\n".join(
                f"--- {p}\n{p.read_text()[-3000:]}"
                for p in sorted((workdir / "logs").rglob("*.log"))
            )
            if (workdir / "logs").exists()
            else ""
        )
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({proc.returncode})\n{proc.stdout[-5000:]}\n{proc.stderr[-8000:]}\n{logs[-12000:]}"
        )
    return proc


def run_test_config(workdir: Path) -> None:
    copy_workflow(workdir)
    snakemake(workdir)


# What the second run recomputes from the first run's trained models, embeddings and Jacobians:
# every metric, the real-embedding alignment jobs and every table, figure and summary. The
# upstream stages' determinism is checked against this run by the reliability tests (the dataset
# rendered again from scratch, the kill tests' reruns of every long stage).
RECOMPUTED = ("results/metrics", "results/alignment/real", "results/tables", "results/figures")


def is_recomputed(output: str) -> bool:
    """Whether :func:`remove_recomputed` removes ``output`` (a path relative to the run)."""
    path = Path(output)
    in_folder = any(path.is_relative_to(part) for part in RECOMPUTED)
    return in_folder or (path.parent == Path("results") and path.suffix == ".md")


def remove_recomputed(workdir: Path) -> None:
    """Remove :data:`RECOMPUTED` and the study summaries (``results/*.md``) from a run."""
    for part in RECOMPUTED:
        shutil.rmtree(workdir / part)
    for summary in (workdir / "results").glob("*.md"):
        summary.unlink()


def rerun_downstream(workdir: Path) -> None:
    """A copy of the shared run with :func:`remove_recomputed` applied, run again."""
    source = build_shared(workdir.parent, "workflow_run")
    shutil.copytree(source, workdir, symlinks=True, dirs_exist_ok=True)
    remove_recomputed(workdir)
    snakemake(workdir)


@pytest.fixture(scope="session")
def workflow_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete run of the workflow on config/test.yaml in a temporary copy, built once per
    pytest run for every worker (tests.shared_runs): read it, never run Snakemake in it (take
    ``completed``)."""
    return build_shared(shared_root(tmp_path_factory.getbasetemp()), "workflow_run")


@pytest.fixture(scope="session")
def second_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared run with its metrics, real-pair alignment, tables and figures recomputed in a
    copy (:func:`rerun_downstream`; the determinism check compares the two)."""
    return build_shared(shared_root(tmp_path_factory.getbasetemp()), "second_run")


@pytest.fixture
def completed(workflow_run: Path, tmp_path: Path) -> Path:
    """A private copy of the completed test run (outputs, logs, Snakemake metadata, mtimes)."""
    dest = tmp_path / "run"
    shutil.copytree(workflow_run, dest, symlinks=True)
    return dest


def plan_in_process(workdir: Path, *configfiles: Path) -> str | None:
    """Parse the workflow in ``workdir`` with ``configfiles`` through Snakemake's API in this
    process (:func:`tests.planning.parse_error`): the error text when the Snakefile refuses the
    config, None when it accepts it. The same code path as ``snakemake --configfile F`` up to
    the first job, without a new interpreter and Snakemake's import (about 4 s a call)."""
    from tests.planning import parse_error

    return parse_error(workdir, *configfiles)


def edit_config(workdir: Path, edit) -> None:
    """Apply ``edit(config)`` to ``config/test.yaml`` of a workflow copy."""
    import yaml

    path = workdir / "config" / "test.yaml"
    config = yaml.safe_load(path.read_text())
    edit(config)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


_limits: list[object] = []  # the workers' BLAS thread limit, held for the session


def pytest_configure(config: pytest.Config) -> None:
    # a plugin, not conftest hooks: conftest hooks do not see session-scoped fixture set-ups
    config.pluginmanager.register(timing, "repdiag-test-times")
    if worker_id():  # two workers on two cores: one torch and one BLAS thread each
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(1)
        _limits.append(threadpool_limits(limits=1, user_api="blas"))


def _rank(module_items: list[pytest.Item]) -> int:
    """The order modules are handed out in, so that no worker waits and none is the tail:
    0: a module that keeps its tests on one worker (xdist_group: an expensive module fixture),
    first; 1: the rest; 2: a grouped module that reads a shared run (the SLURM scenario starts
    from one), after the unit tests, while the background build finishes; 3: the other modules
    reading a shared run, last."""
    grouped = any(item.get_closest_marker("xdist_group") for item in module_items)
    reads_shared = any(set(item.fixturenames) & set(SHARED_RUNS) for item in module_items)
    if reads_shared:
        return 2 if grouped else 3
    return 0 if grouped else 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not worker_id():  # a plain run keeps the file order
        return
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    ordered = sorted(modules.values(), key=_rank)  # stable: file order within a rank
    items[:] = [item for module_items in ordered for item in module_items]


_background: dict[str, subprocess.Popen | None] = {}


def check_grouping(session: pytest.Session) -> None:
    """Refuse a --dist loadgroup run whose grouped tests lost their group (xdist#1386)."""
    if not session.config.getoption("loadgroup", False):
        return
    lost = [
        i.nodeid
        for i in session.items
        if i.get_closest_marker("xdist_group") and "@" not in i.nodeid
    ]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup is not grouping ({lost[0]} has no @group suffix): this pytest and "
            "pytest-xdist do not work together (pytest-dev/pytest-xdist#1386); install the "
            "versions pyproject.toml asks for (make setup)"
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    check_grouping(session)
    if worker_id() == "gw0":
        needed = [
            name for name in SHARED_RUNS if any(name in i.fixturenames for i in session.items)
        ]
        root = shared_root(session.config._tmp_path_factory.getbasetemp())
        _background["builds"] = start_background_builds(root, needed)


def pytest_sessionfinish(session: pytest.Session) -> None:
    stop_background_builds(_background.pop("builds", None))

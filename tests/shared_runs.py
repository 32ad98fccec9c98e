"""Expensive workflow runs built once per pytest run and shared by every xdist worker.

A session fixture runs once per worker process; :func:`shared_dir` instead builds its folder
once in the run's common temporary root (the parent of every worker's), behind a file lock, and
marks it complete only when the build returned, so a failed or killed build is redone by the
next process that asks, never half-read. Readers must not write into a shared folder: tests
that change one take a copy (``completed``, ``without_outputs``).

Under xdist, worker ``gw0`` starts ``python -m tests.shared_runs ROOT FIXTURE...`` in the
background as soon as collection ends, for the shared runs the collected tests use, so they are
built while the unit tests run instead of while a worker waits on the lock; a worker that needs
one before the background build reached it builds it itself (whoever holds the lock builds).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# fixture name -> (folder in the shared root, "module:function" that fills the folder)
SHARED_RUNS: dict[str, tuple[str, str]] = {
    "workflow_run": ("workflow", "tests.conftest:run_test_config"),
    "second_run": ("second", "tests.conftest:rerun_downstream"),
    "on_request": ("on_request", "tests.workflow.test_on_request_targets:build_on_request"),
}


def worker_id() -> str | None:
    return os.environ.get("PYTEST_XDIST_WORKER")


def shared_root(basetemp: Path) -> Path:
    """The folder every process of this pytest run shares: the parent of a worker's basetemp.

    ``REPDIAG_TEST_SHARED_ROOT=DIR`` keeps the shared runs in DIR across pytest runs instead,
    for iterating on the tests that read them; they are then as old as their build, so delete
    DIR (or its ``NAME.complete`` marker) after changing the workflow or the library.
    """
    if kept := os.environ.get("REPDIAG_TEST_SHARED_ROOT"):
        Path(kept).mkdir(parents=True, exist_ok=True)
        return Path(kept)
    return basetemp.parent if worker_id() else basetemp


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:  # not inherited by subprocesses (PEP 446)
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def shared_dir(root: Path, name: str, build: Callable[[Path], None]) -> Path:
    """``root/name`` filled by ``build(folder)`` once, whichever process asks first."""
    folder, done = root / name, root / f"{name}.complete"
    with file_lock(root / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


def builder(fixture: str) -> Callable[[Path], None]:
    module, _, function = SHARED_RUNS[fixture][1].partition(":")
    return getattr(importlib.import_module(module), function)


def build_shared(root: Path, fixture: str) -> Path:
    return shared_dir(root, SHARED_RUNS[fixture][0], builder(fixture))


def start_background_builds(root: Path, fixtures: list[str]) -> subprocess.Popen | None:
    """The background builder of ``fixtures`` (in SHARED_RUNS order), its log in ``root``."""
    ordered = [name for name in SHARED_RUNS if name in fixtures]
    if not ordered:
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    with open(root / "shared_runs.log", "a") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.shared_runs", str(root), *ordered],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # stopped as a group, with the Snakemake it runs
        )


def stop_background_builds(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)


def record_build(fixture: str, start: float) -> None:
    """The background build's span, for the suite's timeline (``benchmarks/tests.py``)."""
    if folder := os.environ.get("REPDIAG_TEST_TIMES"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        with open(Path(folder) / "builds.jsonl", "a") as log:
            log.write(json.dumps({"fixture": fixture, "start": start, "stop": time.time()}) + "\n")


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    for fixture in argv[1:]:
        try:
            start = time.time()
            folder = build_shared(root, fixture)
            record_build(fixture, start)
            print(f"built {fixture} in {folder}", flush=True)
        except Exception:  # the fixture rebuilds it in the test that needs it, and fails there
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

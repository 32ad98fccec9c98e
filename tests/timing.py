"""Where the suite's time goes: per-test phases and per-fixture set-up, recorded when asked.

Active only when ``REPDIAG_TEST_TIMES`` names a folder (``make test`` and ``benchmarks/tests.py`` set it). The
controller records every test's setup/call/teardown durations (xdist forwards the workers'
reports to it); each process records the set-up time of every fixture it builds, so a fixture
shared through :func:`tests.shared_runs.shared_dir` shows where it was built and where it was waited
for. One JSON file per process: ``<folder>/<worker>.json``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.shared_runs import worker_id

TIMES_ENV = "REPDIAG_TEST_TIMES"
_records: dict[str, list] = {"tests": [], "fixtures": []}


def enabled() -> bool:
    return bool(os.environ.get(TIMES_ENV))


def worker() -> str:
    return worker_id() or "controller"


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    start = time.perf_counter()
    yield
    if enabled():
        _records["fixtures"].append(
            {
                "name": fixturedef.argname,
                "scope": fixturedef.scope,
                "where": fixturedef.baseid or "<plugin>",
                "seconds": time.perf_counter() - start,
                "worker": worker(),
                "test": request.node.nodeid,
            }
        )


def pytest_runtest_logreport(report) -> None:
    if enabled() and worker() == "controller":
        node = getattr(report, "node", None)  # xdist's worker that ran it
        _records["tests"].append(
            {
                "nodeid": report.nodeid,
                "when": report.when,
                "seconds": report.duration,
                "start": getattr(report, "start", None),  # epoch seconds: the suite's timeline
                "worker": node.gateway.id if node is not None else "controller",
            }
        )


def pytest_sessionfinish(session) -> None:
    if enabled():
        folder = Path(os.environ[TIMES_ENV])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{worker()}.json").write_text(json.dumps(_records))

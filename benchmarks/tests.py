"""Where `make test`'s time goes: the 20 slowest tests, totals per directory and per fixture.

Runs pytest (with the Makefile's workers unless ``--workers`` says otherwise) with the timing
hooks of ``tests/timing.py`` on, then prints markdown tables: the wall time of the pytest run
and the machine's load, the summed test time (setup + call + teardown) per directory, the 20
slowest tests with their phases, and the costliest fixture set-ups (a fixture shared across
workers is built by one and waited for by the others: both show). ``--write docs/tests.md``
replaces the block between the ``test-times`` markers of that file.

    .venv/bin/python benchmarks/tests.py [--workers 2] [--write docs/tests.md] [-- pytest args]
    .venv/bin/python benchmarks/tests.py --from FOLDER        # tables of a recorded run
    .venv/bin/python benchmarks/tests.py --durations LOG      # from `pytest --durations=0` output
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
START, END = "<!-- test-times:start -->", "<!-- test-times:end -->"


def run_pytest(folder: Path, workers: str, extra: list[str]) -> dict:
    env = {**os.environ, "REPDIAG_TEST_TIMES": str(folder)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
    if workers != "0":
        command += ["-n", workers, "--dist", "loadgroup"]
    load = os.getloadavg()[0]
    start = time.monotonic()
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    run = {"wall_s": wall, "load_before": load, "workers": workers, "summary": summary}
    (folder / "run.json").write_text(json.dumps(run))
    if proc.returncode != 0:
        print(proc.stdout[-5000:], proc.stderr[-3000:], file=sys.stderr)
    return run


def read_records(folder: Path) -> tuple[dict, list[dict], list[dict]]:
    run = json.loads((folder / "run.json").read_text()) if (folder / "run.json").exists() else {}
    tests: list[dict] = []
    fixtures: list[dict] = []
    for path in sorted(folder.glob("*.json")):
        if path.name == "run.json":
            continue
        records = json.loads(path.read_text())
        tests += records["tests"]
        fixtures += records["fixtures"]
    return run, tests, fixtures


DURATION_LINE = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S.*)$")


def read_durations(log: Path) -> list[dict]:
    """Test records from the ``--durations=0`` table of a pytest log (a run without the hooks)."""
    return [
        {"nodeid": m.group(3).strip(), "when": m.group(2), "seconds": float(m.group(1))}
        for m in map(DURATION_LINE.match, log.read_text().splitlines())
        if m
    ]


def without_group(nodeid: str) -> str:
    """The test's id without the ``@group`` suffix that ``--dist loadgroup`` appends."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def per_test(tests: list[dict]) -> dict[str, dict[str, float]]:
    phases: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for record in tests:
        phases[without_group(record["nodeid"])][record["when"]] += record["seconds"]
    return phases


def directory_of(nodeid: str) -> str:
    return str(Path(nodeid.split("::")[0]).parent)


def tables(run: dict, tests: list[dict], fixtures: list[dict], top: int = 20) -> str:
    phases = per_test(tests)
    total = {nodeid: sum(p.values()) for nodeid, p in phases.items()}
    lines = []
    if run:
        lines += [
            f"pytest wall time {run['wall_s'] / 60:.1f} min with {run['workers']} workers "
            f"(load {run['load_before']:.2f} before the run); {run['summary']}",
            "",
        ]
    lines += [
        f"{len(phases)} tests, {sum(total.values()) / 60:.1f} test-minutes in all "
        "(setup + call + teardown, summed over workers).",
        "",
        "| directory | tests | test-minutes |",
        "|---|---|---|",
    ]
    by_dir: dict[str, list[float]] = defaultdict(list)
    for nodeid, seconds in total.items():
        by_dir[directory_of(nodeid)].append(seconds)
    for folder, values in sorted(by_dir.items(), key=lambda item: -sum(item[1])):
        lines.append(f"| `{folder}` | {len(values)} | {sum(values) / 60:.2f} |")
    lines += ["", f"The {top} slowest tests:", ""]
    lines += ["| test | total s | setup s | call s | teardown s |", "|---|---|---|---|---|"]
    for nodeid in sorted(total, key=lambda n: -total[n])[:top]:
        p = phases[nodeid]
        lines.append(
            f"| `{nodeid}` | {total[nodeid]:.1f} | {p['setup']:.1f} | {p['call']:.1f} "
            f"| {p['teardown']:.1f} |"
        )
    lines += ["", "Fixture set-ups over 5 s (one row per fixture, summed over the runs of it):", ""]
    lines += ["| fixture | scope | defined in | set-ups | seconds |", "|---|---|---|---|---|"]
    by_fixture: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for record in fixtures:
        by_fixture[(record["name"], record["scope"], record["where"])].append(record["seconds"])
    for (name, scope, where), values in sorted(by_fixture.items(), key=lambda i: -sum(i[1])):
        if sum(values) >= 5:
            lines.append(f"| `{name}` | {scope} | `{where}` | {len(values)} | {sum(values):.1f} |")
    return "\n".join(lines) + "\n"


def write_block(path: Path, block: str) -> None:
    text = path.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{path}: no {START} ... {END} block to replace")
    path.write_text(pattern.sub(lambda _: f"{START}\n{block}{END}", text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default=os.environ.get("TEST_WORKERS", "auto"))
    parser.add_argument("--from", dest="source", type=Path, help="a folder of recorded times")
    parser.add_argument("--durations", type=Path, help="a pytest log with --durations=0")
    parser.add_argument("--write", type=Path, help="replace the test-times block of this file")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    if args.durations:
        note = "From a `--durations=0` log, which omits the tests whose phases all took < 5 ms.\n\n"
        print(note + tables({}, read_durations(args.durations), []))
        return
    if args.source:
        folder = args.source
    else:
        folder = Path(tempfile.mkdtemp(prefix="repdiag-test-times-"))
        run_pytest(folder, args.workers, args.pytest_args)
        print(f"records in {folder}", file=sys.stderr)
    block = tables(*read_records(folder))
    print(block)
    if args.write:
        write_block(args.write, block)


if __name__ == "__main__":
    main()

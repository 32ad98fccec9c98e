"""Peak resident memory of a block of code, whatever ran before it in the process.

``getrusage().ru_maxrss`` cannot bound one case inside a test suite: it is the peak over the
process's whole life (a case after a larger one shows no growth), and Linux keeps it across
``execve``, so a fresh interpreter started by a large pytest worker starts at the worker's peak.
``VmHWM`` in ``/proc/self/status`` belongs to the current address space (new after ``execve``),
and writing ``5`` to ``/proc/self/clear_refs`` resets it to the current resident size (Linux
4.0+, proc(5)).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 300  # only against a hang; nothing is timed

STATUS = Path("/proc/self/status")


def _status_mib(field: str) -> float:
    for line in STATUS.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"{STATUS} has no {field}")


def peak_mib() -> float:
    """The peak resident size of this address space (VmHWM), in MiB."""
    return _status_mib("VmHWM")


def reset_peak() -> float:
    """Reset the peak to the current resident size (VmRSS); return that size in MiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mib("VmRSS")


def peak_growth_mib(action: Callable[[], object]) -> float:
    """MiB by which this process's resident memory peaked above its size before ``action()``."""
    before = reset_peak()
    action()
    return peak_mib() - before


# The same, as source for a fresh interpreter: ``exec(SUBPROCESS_SOURCE)`` defines peak_mib().
SUBPROCESS_SOURCE = (
    "def peak_mib():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            return int(line.split()[1]) / 1024\n"
)


def run_measured(code: str, prelude: str = "", env: dict[str, str] | None = None) -> dict:
    """Run ``prelude`` then ``code`` in a fresh interpreter (one OpenMP thread, the repository as
    working folder); ``code`` fills the dict ``result``. Returns ``result`` with ``peak_mib``, the
    interpreter's peak resident size at the end (``peak_mib()`` is defined for both)."""
    script = (
        SUBPROCESS_SOURCE
        + "result = {}\n"
        + textwrap.dedent(prelude)
        + "\n"
        + textwrap.dedent(code)
        + "\nimport json\nresult['peak_mib'] = peak_mib()\nprint('RESULT' + json.dumps(result))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT") :])

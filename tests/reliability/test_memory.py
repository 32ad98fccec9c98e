"""tests/reliability/memory.py: a case's peak memory, not the process's or its parent's."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from tests.reliability.memory import SUBPROCESS_SOURCE, peak_growth_mib, peak_mib


def _touch(mib: int) -> None:
    block = np.ones(mib * 2**20 // 8)  # written, so resident
    block[::512] = 2.0


def test_the_growth_of_a_later_smaller_case_is_seen() -> None:
    _touch(300)  # an earlier, larger case
    assert peak_growth_mib(lambda: _touch(100)) >= 90  # ru_maxrss would show 0 here


def test_a_fresh_interpreter_does_not_inherit_the_parents_peak() -> None:
    _touch(300)
    assert peak_mib() >= 300
    code = SUBPROCESS_SOURCE + "import json\nprint(json.dumps(peak_mib()))\n"
    child = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    )
    assert child < 100  # a bare interpreter

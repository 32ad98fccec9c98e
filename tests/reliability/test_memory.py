"""tests/reliability/memory.py: a case's peak memory, not the process's or its parent's."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from tests.conftest import REPO
from tests.reliability.memory import SUBPROCESS_SOURCE, peak_mib


def _touch(mib: int) -> None:
    block = np.ones(mib * 2**20 // 8)  # written, so resident
    block[::512] = 2.0


def test_the_growth_of_a_later_smaller_case_is_seen() -> None:
    """In a fresh interpreter (a long-lived worker may hand a new block freed pages it still
    holds, which adds no resident memory): ru_maxrss would show 0 here."""
    code = (
        "import json, numpy as np\n"
        "from tests.reliability.memory import peak_growth_mib\n"
        "def touch(mib):\n"
        "    block = np.ones(mib * 2**20 // 8)\n"
        "    block[::512] = 2.0\n"
        "touch(300)\n"  # an earlier, larger case
        "print(json.dumps(peak_growth_mib(lambda: touch(100))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) >= 90


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

"""Deterministic fault points for the fault-injection tests (loaded through PYTHONPATH).

Every Python process started with this directory on PYTHONPATH imports this module at start-up.
When ``REPDIAG_FAULT_AT`` is set, the process acts at a chosen point of its work:

- ``progress:<label>:<n>``: when a :class:`repdiag.core.runtime.Progress` whose label contains
  ``<label>`` reaches ``n`` done (mid-loop: training steps, images, Jacobian chunks);
- ``store:<path>:<n>``: after the ``n``-th chunk or metadata write into a zarr store whose path
  contains ``<path>`` (mid-write of an output store).

``REPDIAG_FAULT`` says what happens there. ``kill``: SIGKILL, like a node failure or the OOM
killer; ``REPDIAG_FAULT_SCOPE=job`` kills the job process only (Snakemake sees a failed job),
``all`` every process of the session, which the test starts with Snakemake as its leader (the
whole run dies). ``pause``: wait until the file ``REPDIAG_FAULT_RELEASE`` exists, then go on.
Either way the process first writes ``REPDIAG_FAULT_MARKER``, so a test knows the point was
reached (and, for ``pause``, that the job is running now).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

SPEC = os.environ.get("REPDIAG_FAULT_AT")


def _kill_session(sid: int) -> None:
    """SIGKILL every other process of session ``sid``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.getsid(int(entry.name)) == sid:
                os.kill(int(entry.name), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _act() -> None:
    marker = os.environ.get("REPDIAG_FAULT_MARKER")
    if marker:
        Path(marker).write_text(f"pid {os.getpid()} reached {SPEC}\n")
    if os.environ.get("REPDIAG_FAULT", "kill") == "pause":
        release = Path(os.environ["REPDIAG_FAULT_RELEASE"])
        while not release.exists():
            time.sleep(0.05)
        return
    if os.environ.get("REPDIAG_FAULT_SCOPE") == "all":
        _kill_session(os.getsid(0))
    os.kill(os.getpid(), signal.SIGKILL)


def _at_progress(label: str, at: int) -> None:
    from repdiag.core import runtime

    update = runtime.Progress.update
    fired = False

    def update_then_act(self, n: int = 1) -> None:
        nonlocal fired
        update(self, n)
        if not fired and label in self.what and self.done >= at:
            fired = True
            _act()

    runtime.Progress.update = update_then_act


def _at_store_write(path_part: str, at: int) -> None:
    from zarr.storage import LocalStore

    set_value = LocalStore.set
    writes = 0

    async def set_then_act(self, key, value):
        nonlocal writes
        await set_value(self, key, value)
        if path_part in str(self.root):
            writes += 1
            if writes == at:
                _act()

    LocalStore.set = set_then_act


if SPEC:
    kind, _, rest = SPEC.partition(":")
    target, _, count = rest.rpartition(":")
    if kind == "progress" and count.isdigit():
        _at_progress(target, int(count))
    elif kind == "store" and count.isdigit():
        _at_store_write(target, int(count))
    else:
        raise SystemExit(
            f"REPDIAG_FAULT_AT={SPEC!r}: expected progress:<label>:<n> or store:<path>:<n>"
        )

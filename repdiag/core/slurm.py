"""Make snakemake-executor-plugin-slurm notice jobs killed with ``scancel``.

The plugin polls ``sacct -X --parsable2 --format=JobIdRaw,State`` and compares each state with
its list of failure states (``CANCELLED``, ``FAILED``, ``TIMEOUT``...). For a job killed with
``scancel``, sacct reports ``CANCELLED by <uid>``, which is in no list, so the plugin (2.8.0 and
earlier) treats the job as still running and Snakemake waits forever. Reducing every state to
its first word (``CANCELLED by 0`` -> ``CANCELLED``, as squeue prints it) fixes that; states that
are one word already are unchanged, so the patch is a no-op once the plugin handles this itself.

``rules/common.smk`` calls :func:`patch_slurm_status` when the workflow is loaded; it does nothing
where the plugin is not installed. tests/slurm/test_slurm.py checks the behaviour on a real SLURM.

:func:`jacobian_runtime` gives each ``jacobian_spectra`` job its SLURM runtime per model, from
the table the GPU benchmark writes (profiles/slurm/jacobian_runtimes.yaml), longer on retries.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PLUGIN = "snakemake_executor_plugin_slurm"
QUERY = "query_job_status"
_PATCHED = "_repdiag_normalises_states"

Query = Callable[[str, Any], Awaitable[tuple[dict[str, str] | None, float | None]]]


def base_state(state: str) -> str:
    """The SLURM job state without sacct's qualifier: ``"CANCELLED by 0"`` -> ``"CANCELLED"``."""
    words = state.split()
    return words[0] if words else state


def normalising(query: Query) -> Query:
    """Wrap the plugin's ``query_job_status(command, logger)`` to return base states."""

    @functools.wraps(query)
    async def query_job_status(command: str, logger: Any):
        states, seconds = await query(command, logger)
        if states is not None:
            states = {job: base_state(state) for job, state in states.items()}
        return states, seconds

    setattr(query_job_status, _PATCHED, True)
    return query_job_status


def patch_slurm_status() -> bool:
    """Install the wrapper in the plugin when it is installed; True when it is in place."""
    try:
        __import__(PLUGIN)
    except ImportError:
        return False
    plugin = sys.modules[PLUGIN]
    query = getattr(plugin, QUERY, None)
    if query is None:
        log.warning(
            "%s has no %s: jobs killed with scancel may not be reported failed "
            "(repdiag.core.slurm needs updating for this plugin version)",
            PLUGIN,
            QUERY,
        )
        return False
    if not getattr(query, _PATCHED, False):
        setattr(plugin, QUERY, normalising(query))
    return True


# ----------------------------------------------------------------------------------------------
# Per-model runtimes of the Jacobian jobs
# ----------------------------------------------------------------------------------------------

JACOBIAN_RUNTIME_MIN = 240  # a model the table does not name (minutes per attempt)
RUNTIMES_FILE = "profiles/slurm/jacobian_runtimes.yaml"
MARGIN = 1.5  # on the projected time: the projection is of one measured pass per architecture


def runtime_minutes(projected_hours: float) -> int:
    """SLURM minutes for a projected time: ``ceil(MARGIN x minutes)``, at least 30."""
    import math

    return max(30, math.ceil(MARGIN * projected_hours * 60))


def jacobian_runtime(model: str, attempt: int, table: str | Path) -> int:
    """``runtime`` (minutes) of ``jacobian_spectra`` for ``model`` at ``attempt`` (1, 2, ...):
    the table's minutes (written by ``benchmarks/gpu.sh --runtimes``: the planner's FLOPs at
    the benchmark's measured rates, :func:`runtime_minutes`), else :data:`JACOBIAN_RUNTIME_MIN`,
    times the attempt (a retried job resumes from its chunk cache and gets longer)."""
    minutes = JACOBIAN_RUNTIME_MIN
    path = Path(table)
    if path.is_file():
        entries = _runtime_table(path.resolve(), path.stat().st_mtime_ns)
        minutes = int(entries.get(model, minutes))
    return minutes * max(1, int(attempt))


@functools.cache
def _runtime_table(path: Path, mtime_ns: int) -> dict[str, Any]:
    """The runtimes table, parsed once per process and version (one lookup per planned job)."""
    import yaml

    entries = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if not isinstance(entries or {}, dict):
        raise ValueError(f"{path}: expected a mapping model -> minutes; rewrite it with "
                         "benchmarks/gpu.sh --runtimes")  # fmt: skip
    return entries or {}

"""``snakemake`` with the SLURM executor's status checks at most CAP_S seconds apart.

Usage: ``python tests/slurm/capped_status_checks.py SNAKEMAKE_ARGS...`` (the same arguments as
the ``snakemake`` command).

snakemake-executor-plugin-slurm waits 10 s longer after every status check in which no job
completed (up to 180 s), whatever ``--seconds-between-status-checks`` says: right for jobs of
hours, but the SLURM test's jobs take seconds, so it waited more for the checks (a cancel noticed
20 s late, then 30 s more in a last sleep before exiting; every job seen done 10-20 s late)
than for the jobs. This caps that interval and changes nothing else: what is submitted, how
states are queried and what a state means stay the plugin's. Only the Snakemake process that
submits uses this; the jobs run the plain ``python -m snakemake`` the plugin writes.

When the interface's attribute is not where this expects (another plugin interface version),
it says so on stderr and runs unchanged: slower, never different.
"""

from __future__ import annotations

import sys

CAP_S = 2


def cap_status_check_interval(cap_s: float = CAP_S) -> bool:
    """Clamp every interval the executor sets to ``cap_s``; False when there is nothing to clamp."""
    from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

    interval = getattr(RemoteExecutor, "next_seconds_between_status_checks", None)
    if not isinstance(interval, property) or interval.fset is None:
        return False

    def capped(executor, seconds):
        interval.fset(executor, seconds if seconds is None else min(seconds, cap_s))

    RemoteExecutor.next_seconds_between_status_checks = interval.setter(capped)
    return True


def main() -> int:
    if not cap_status_check_interval():
        print(
            "capped_status_checks: RemoteExecutor.next_seconds_between_status_checks is not a "
            "settable property here; status checks keep the plugin's back-off",
            file=sys.stderr,
        )
    from snakemake.cli import main as snakemake_main

    sys.argv[0] = "snakemake"
    return snakemake_main()


if __name__ == "__main__":
    sys.exit(main())

"""Every job's params, planned at one commit, and two such records compared.

A refactor that keeps behaviour keeps every rule's params (Snakemake reruns a job whose params
change). ``python -m tests.params dump OUT`` plans every target on each of :data:`CONFIGS` with
``forceall`` (a dry run through :func:`tests.planning.plan`: nothing executes) in the checkout
whose ``repdiag`` and ``tests`` are imported, and writes ``{config:target: {rule:wildcards:
params}}`` as JSON; ``python -m tests.params compare BEFORE AFTER`` prints each job whose params
differ or that one side lacks, and exits 1 when any does. Run ``dump`` once under each commit's
code (docs/guide.md, "Check that a refactor changed nothing", says how).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CONFIGS = ("config/test.yaml", "config/config.yaml", "config/paper.yaml")


def dump(repo: Path) -> dict[str, Any]:
    """``{config:target: {rule:wildcards: params}}`` for every target the checkout names (a
    target a config cannot plan records Snakemake's refusal instead)."""
    from repdiag.studies import TARGETS
    from tests.planning import PlanError, plan

    record: dict[str, Any] = {}
    for config in CONFIGS:
        for target in ("all", *(t.name for t in TARGETS)):
            try:
                jobs = plan(repo, target, configfiles=(config,), forceall=True)
            except PlanError as err:
                record[f"{config}:{target}"] = f"refused: {str(err).splitlines()[0][:200]}"
                continue
            record[f"{config}:{target}"] = {
                f"{job.rule}:{sorted(job.wildcards.items())}": job.params for job in jobs
            }
    return json.loads(json.dumps(record, sort_keys=True, default=repr))


def compare(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, list[str]]:
    """(jobs compared, one line per job whose params differ or that one side lacks)."""
    found, compared = [], 0
    for plan_name in sorted(set(before) | set(after)):
        old, new = before.get(plan_name), after.get(plan_name)
        if not (isinstance(old, dict) and isinstance(new, dict)):
            if old != new:
                found.append(f"{plan_name}: {old!r:.120} -> {new!r:.120}")
            continue
        for job in sorted(set(old) | set(new)):
            compared += 1
            if old.get(job) != new.get(job):
                found.append(f"{plan_name} {job}: {old.get(job)!r:.160} -> {new.get(job)!r:.160}")
    return compared, found


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) == 2 and args[0] == "dump":
        Path(args[1]).write_text(json.dumps(dump(Path.cwd()), sort_keys=True))
        return 0
    if len(args) == 3 and args[0] == "compare":
        before, after = (json.loads(Path(arg).read_text()) for arg in args[1:])
        compared, found = compare(before, after)
        for line in found:
            print(line)
        print(f"{compared} jobs compared, {len(found)} differ")
        return 1 if found else 0
    print("usage: python -m tests.params dump OUT.json | compare BEFORE.json AFTER.json")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())

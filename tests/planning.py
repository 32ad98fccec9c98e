"""What Snakemake would run, asked in process, and the tests' configs built in one place.

:func:`plan` is the dry run the workflow tests read: the jobs Snakemake's own DAG marks as
needing a run, each with its rule, wildcards and reason, taken from the DAG object rather than
parsed from ``snakemake -n``'s text. It runs through Snakemake's API in this process (about
4 s of CPU less than a new interpreter per call) and executes nothing.

:func:`tiny_config` builds a test config from ``config/test.yaml`` with overrides, so that
tests state only what they change (SAELens's ``build_*_cfg(**overrides)``).
"""

from __future__ import annotations

import copy
import os
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
TEST_CONFIG = Path("config") / "test.yaml"


@dataclass(frozen=True)
class Planned:
    """One job a dry run would execute: its rule, wildcards, outputs and Snakemake's reason."""

    rule: str
    wildcards: dict[str, str] = field(hash=False)
    outputs: tuple[str, ...] = field(hash=False, default=())
    inputs: tuple[str, ...] = field(hash=False, default=())
    reason: str = field(hash=False, default="")
    resources: dict[str, object] = field(hash=False, default_factory=dict)
    params: dict[str, object] = field(hash=False, default_factory=dict)

    @property
    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """(rule, sorted wildcards): what identifies the job across two plans."""
        return self.rule, tuple(sorted(self.wildcards.items()))


class PlanError(RuntimeError):
    """Snakemake refused to plan: the Snakefile, its config checks or the DAG failed."""


def _plan_only(found: list[Planned], rules: set[str]):
    """A stand-in for ``Workflow.execute`` that builds and post-processes the DAG as a dry run
    does, records its jobs and returns before the scheduler starts."""

    def execute(workflow, *args, **kwargs) -> bool:
        workflow._prepare_dag(
            forceall=workflow.dag_settings.forceall,
            ignore_incomplete=workflow.execution_settings.ignore_incomplete,
            lock_warn_only=True,
            nolock=True,
        )
        workflow._build_dag()
        workflow.async_run(workflow.dag.postprocess(update_needrun=False, check_initial=True))
        dag = workflow.dag
        rules.update(rule.name for rule in workflow.rules)
        found.extend(
            Planned(
                job.rule.name,
                {k: str(v) for k, v in job.wildcards_dict.items()},
                tuple(str(f) for f in job.output),
                tuple(str(f) for f in job.input),
                str(dag.reason(job)),
                dict(job.resources.items()),
                dict(job.params.items()),
            )
            for job in dag.needrun_jobs()
        )
        return True

    return execute


def plan(
    workdir: Path,
    *targets: str,
    configfiles: Iterable[Path | str] = (TEST_CONFIG,),
    forceall: bool = False,
    rules: set[str] | None = None,
) -> list[Planned]:
    """The jobs ``snakemake -n TARGETS --configfile F...`` would run in ``workdir``, the
    target rule ``all`` left out; sorted by rule, then wildcards.

    ``configfiles`` (relative to ``workdir``) replace config/config.yaml, as the workflow profile makes
    them. ``rules``, when given, receives the name of every rule the workflow defines (so that
    a test can check that the names it asserts on exist). Raises :class:`PlanError` with
    Snakemake's message when it refuses to plan.
    """
    workflow_class = _workflow_class()
    found: list[Planned] = []
    execute = workflow_class.execute
    workflow_class.execute = _plan_only(found, set() if rules is None else rules)
    try:
        _execute(workdir, targets or ("all",), configfiles, forceall, "dryrun")
    finally:
        workflow_class.execute = execute
    jobs = [job for job in found if job.rule != "all"]
    return sorted(jobs, key=lambda job: job.key)


def mark_done(
    workdir: Path, *targets: str, configfiles: Iterable[Path | str] = (TEST_CONFIG,)
) -> None:
    """Create every output of ``targets`` (default ``all``) empty and let Snakemake's touch
    executor record their jobs as done (params and code included), running nothing: a planned
    workflow whose staleness a test can then probe."""
    for job in plan(workdir, *targets, configfiles=configfiles, forceall=True):
        for output in job.outputs:
            path = workdir / output
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir(exist_ok=True) if output.endswith(".zarr") else path.write_text("")
    _execute(workdir, targets or ("all",), configfiles, True, "touch")


def _workflow_class():
    from snakemake.api import SnakemakeApi  # noqa: F401  (loads snakemake.workflow first)

    return sys.modules["snakemake.workflow"].Workflow  # a circular import forbids importing it


@contextmanager
def _api_workflow(workdir: Path, configfiles: Iterable[Path | str]) -> Iterator[Any]:
    """Snakemake's API on ``workdir`` in this process (``configfiles`` replace config/config.yaml);
    Snakemake's errors become :class:`PlanError` with its message, the working folder is kept."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    cwd = Path.cwd()
    try:
        with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
            yield api.workflow(
                resource_settings=ResourceSettings(cores=2),
                config_settings=ConfigSettings(
                    configfiles=[workdir / f for f in configfiles], replace_workflow_config=True
                ),
                snakefile=workdir / "Snakefile",
                workdir=workdir,
            )
    except Exception as err:  # Snakemake wraps the Snakefile's errors in its own types
        raise PlanError(f"{type(err).__name__}: {err}") from err
    finally:
        os.chdir(cwd)


def parse_error(workdir: Path, *configfiles: Path | str) -> str | None:
    """The error text when the Snakefile (its config reading, schema and semantic checks)
    refuses ``configfiles``, None when it accepts them; no DAG is built, nothing runs. Checks in
    ``onstart`` (weights caches, taps of built models) are not reached: a real run tests those."""
    try:
        with _api_workflow(workdir, configfiles) as workflow:
            workflow.dag()
    except PlanError as err:
        return str(err)
    return None


def _execute(
    workdir: Path,
    targets: Iterable[str],
    configfiles: Iterable[Path | str],
    forceall: bool,
    executor: str,
) -> None:
    """Snakemake's API on ``workdir`` with ``executor`` (dryrun or touch), in this process."""
    from snakemake.settings.types import DAGSettings

    with _api_workflow(workdir, configfiles) as workflow:
        dag = workflow.dag(DAGSettings(targets=set(targets), forceall=forceall))
        dag.execute_workflow(executor=executor)


def rule_counts(jobs: Iterable[Planned]) -> Counter[str]:
    """Rule -> number of planned jobs (the "Job stats" table of a dry run)."""
    return Counter(job.rule for job in jobs)


def wildcard_values(jobs: Iterable[Planned], rule: str, wildcard: str) -> list[str]:
    """The sorted values of ``wildcard`` over the planned jobs of ``rule``."""
    return sorted(job.wildcards[wildcard] for job in jobs if job.rule == rule)


@cache
def _test_config() -> dict[str, Any]:
    return yaml.safe_load((REPO / TEST_CONFIG).read_text())


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def tiny_config(**overrides: Any) -> dict[str, Any]:
    """``config/test.yaml`` (the smallest config that runs every stage) with ``overrides``
    merged in: a mapping is merged key by key into the section it names, anything else replaces
    the value. ``tiny_config(models={...}, zoo={"objectives": {"dino": {"steps": 2}}})``."""
    return _merge(copy.deepcopy(_test_config()), overrides)


def resolved_config(**overrides: Any) -> dict[str, Any]:
    """:func:`tiny_config` with every schema default filled in, as the workflow's stages see it
    (:func:`repdiag.core.config.fill_defaults`)."""
    from repdiag.core.config import fill_defaults

    return fill_defaults(tiny_config(**overrides))


def write_config(workdir: Path, config: dict[str, Any], name: str = "test.yaml") -> Path:
    """Write ``config`` as ``workdir/config/NAME`` and return its path relative to ``workdir``."""
    path = Path("config") / name
    (workdir / path).write_text(yaml.safe_dump(config, sort_keys=False))
    return path

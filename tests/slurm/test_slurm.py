"""The SLURM profile against a real single-node SLURM (slurmctld, slurmd, slurmdbd, MariaDB).

Targets: ``results/datasets/binding.zarr`` and ``results/metrics/simclr.json`` of
config/test.yaml. SLURM runs only the jobs that matter here, extract_embeddings[simclr] (a GPU
rule, mapped to CPU here) and compute_metrics[simclr]: the upstream jobs (render_binding,
train_zoo) come from the session's local run, whose outputs, logs, Snakemake metadata and mtimes
a copy keeps. Each SLURM job starts its own Snakemake and script, so every job saved is tens of
seconds.

Scenario, shared by the tests of this module:
1. the reference: the session's local run of config/test.yaml (``workflow_run``, shared with
   the workflow tests; it is built in the background while the cluster starts);
2. a copy of it without the two jobs' outputs, logs and benchmarks must plan exactly those two
   jobs (nothing upstream reruns for mtimes, code or params);
3. in that copy, ``snakemake --workflow-profile profiles/slurm`` (plus the CPU override) until
   the extract_embeddings job's script, under SLURM, is paused in the middle of writing its store
   (tests/reliability/killpoints, so the cancel can never come after the job finished); the test
   then also leaves a truncated store at the job's output path (what a writer killed mid-write
   without a temporary sibling leaves) and kills the job with ``scancel``; Snakemake must report
   the job failed and exit non-zero;
4. a dry run must schedule the cancelled job again (its partial output is not taken as done);
5. the same SLURM command again completes the workflow: the embeddings store equals the local
   run's bitwise and the metrics JSON equals the local run's.

Snakemake runs through capped_status_checks.py, which keeps the SLURM plugin's status checks at
most 2 s apart (the plugin backs off by 10 s a check, up to 180 s, which here cost more than the
jobs); submission and status handling are the plugin's own.

Every wait is for an event (a file, a job state, a process exit), with a time limit only as a
generous hang guard: no outcome depends on the machine's speed. Skips, with the reason, only where SLURM cannot be installed (not root, no
apt-get, packages not installable). Run alone with ``pytest -m slurm``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
import zarr

from tests.conftest import REPO
from tests.outputs import assert_same_arrays
from tests.planning import Planned, plan, rule_counts
from tests.shared_runs import (
    shared_root,
    start_background_builds,
    stop_background_builds,
    worker_id,
)
from tests.slurm.local_slurm import (
    LocalSlurm,
    SlurmUnavailable,
    cpu_override_args,
    job_table,
    live_jobs,
)

# one worker for the module: one SLURM cluster and one scenario per run
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm/test_slurm")]

PROFILE = REPO / "profiles" / "slurm" / "config.yaml"
CAPPED_SNAKEMAKE = Path(__file__).with_name("capped_status_checks.py")
KILLPOINTS = REPO / "tests" / "reliability" / "killpoints"
TARGETS = ("results/datasets/binding.zarr", "results/metrics/simclr.json")
CANCELLED_RULE = "extract_embeddings"
CANCELLED_OUTPUT = "results/embeddings/simclr.zarr"
CANCELLED_LOG = "logs/extract_embeddings/simclr.log"
METRICS = "results/metrics/simclr.json"
# where the cancelled job's script waits to be cancelled: its 4th write into the new store
PAUSE_AT = "store:embeddings/.simclr.zarr.tmp:4"
# The jobs SLURM runs (the rest of TARGETS' jobs come from the local run): their rules, and what
# the copy of the local run loses so that they run again (outputs, logs, benchmarks).
SLURM_RULES = {CANCELLED_RULE: 1, "compute_metrics": 1}
REMOVED = (
    CANCELLED_OUTPUT,
    METRICS,
    CANCELLED_LOG,
    "logs/compute_metrics/simclr.log",
    "logs/benchmarks/extract_embeddings/simclr.tsv",
    "logs/benchmarks/compute_metrics/simclr.tsv",
)
# Hang guards only, far above what the runs take (status checks are at most 2 s apart).
RUN_TIMEOUT_S = 900
NOTICE_CANCEL_S = 240


@dataclass
class Run:
    returncode: int
    output: str
    seconds: float


@dataclass
class Scenario:
    cluster: LocalSlurm
    workdir: Path
    cancelled: Run
    cancelled_job: str
    partial_after_failure: bool
    planned: list[Planned]
    rerun: Run
    jobs: list[dict[str, str]]


def _profile() -> dict:
    return yaml.safe_load(PROFILE.read_text())


@pytest.fixture(scope="module")
def local_run_building(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The shared local run (``workflow_run``) building in the background while SLURM is
    installed and started. Under xdist worker gw0 already does this; a plain pytest run does
    not, so this fixture starts it (a run already built, or building elsewhere, is waited for,
    never built twice: tests.shared_runs). Not for a user who cannot run SLURM here (the
    cluster skips at once, and the build would be stopped half-done)."""
    builds = None
    if worker_id() is None and os.geteuid() == 0:
        root = shared_root(tmp_path_factory.getbasetemp())
        builds = start_background_builds(root, ["workflow_run"])
    yield
    stop_background_builds(builds)  # finished by then, unless SLURM was skipped or failed


@pytest.fixture(scope="module")
def cluster(local_run_building: None) -> LocalSlurm:
    """A fresh single-node SLURM cluster for this module; its daemons stop in the finalizer."""
    partition = _profile()["default-resources"]["slurm_partition"]
    root = Path(tempfile.mkdtemp(prefix="repdiag-slurm-", dir="/tmp"))  # short socket paths
    # REPDIAG_SLURM_ACCOUNTING=squeue tries the fallback arrangement (no slurmdbd) on purpose.
    accounting = os.environ.get("REPDIAG_SLURM_ACCOUNTING", "slurmdbd")
    slurm = LocalSlurm(root, partition=partition, accounting=accounting)
    try:
        slurm.start()
    except SlurmUnavailable as reason:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"SLURM unavailable: {reason}")
    if slurm.fallback_reason:
        warnings.warn(
            "slurmdbd did not start; job states come from squeue (MinJobAge=3600): "
            + slurm.fallback_reason,
            stacklevel=1,
        )
    try:
        yield slurm
    finally:
        slurm.stop()
        shutil.rmtree(root, ignore_errors=True)


def _slurm_command(slurm: LocalSlurm) -> list[str]:
    status = ["--slurm-status-command", "squeue"] if slurm.accounting == "squeue" else []
    return [
        # snakemake, with the plugin's status checks at most 2 s apart (it backs off to 180 s)
        sys.executable,
        str(CAPPED_SNAKEMAKE),
        "--workflow-profile",
        "profiles/slurm",
        "--configfile=config/test.yaml",
        *cpu_override_args(_profile(), int(slurm.node["RealMemory"])),
        # the scenario is a job that failed for good: the profile's retries would resubmit it
        "--retries=0",
        # poll often: the jobs here take seconds, not hours
        "--seconds-between-status-checks=2",
        "--slurm-init-seconds-before-status-checks=2",
        *status,
        *TARGETS,
    ]


def _env(slurm: LocalSlurm) -> dict[str, str]:
    return {**slurm.env(), "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0", "HF_HUB_OFFLINE": "1"}


def _pause_env(marker: Path) -> dict[str, str]:
    """Every Python process of the run loads tests/reliability/killpoints/sitecustomize.py: the
    one that writes the CANCELLED_RULE job's store writes ``marker`` at PAUSE_AT and waits there
    (its release file never comes), so the job is cancelled mid-write, never after it finished."""
    path = os.pathsep.join(filter(None, [str(KILLPOINTS), os.environ.get("PYTHONPATH")]))
    return {
        "PYTHONPATH": path,
        "REPDIAG_FAULT": "pause",
        "REPDIAG_FAULT_AT": PAUSE_AT,
        "REPDIAG_FAULT_MARKER": str(marker),
        "REPDIAG_FAULT_RELEASE": str(marker.with_name("never-released")),
    }


def _start(
    slurm: LocalSlurm, workdir: Path, name: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, Path]:
    log = workdir.parent / f"{workdir.name}-{name}.log"
    with open(log, "w") as stream:
        proc = subprocess.Popen(
            _slurm_command(slurm),
            cwd=workdir,
            env={**_env(slurm), **(env or {})},
            stdout=stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, log


def _finish(proc: subprocess.Popen, log: Path, started: float, timeout_s: float) -> Run:
    """Wait for snakemake; after ``timeout_s`` stop it (SIGTERM cancels its jobs) and say so."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with open(log, "a") as stream:
            stream.write(f"\n[test] snakemake was still running after {timeout_s:.0f} s: stopped\n")
    return Run(proc.returncode, log.read_text(), time.monotonic() - started)


def _wait_running(slurm: LocalSlurm, proc: subprocess.Popen, log: Path, marker: Path) -> str:
    """The SLURM id of the CANCELLED_RULE job once its script is paused mid-write (``marker``)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"snakemake exited ({proc.returncode}) before {CANCELLED_RULE} ran:\n"
                f"{log.read_text()[-6000:]}\n{slurm.diagnostics()}"
            )
        paused = marker.exists()
        for job in live_jobs(slurm):
            ours = job["comment"].startswith(f"rule_{CANCELLED_RULE}")
            if ours and job["state"] == "RUNNING" and paused:
                return job["id"]
        time.sleep(0.5)
    pytest.fail(f"{CANCELLED_RULE} never ran under SLURM:\n{log.read_text()[-6000:]}")


def copy_without_slurm_jobs(local_run: Path, dest: Path) -> Path:
    """A copy of the local run (metadata and mtimes kept) without REMOVED; it must plan exactly
    the SLURM_RULES jobs, else the SLURM run would redo (or skip) other work."""
    shutil.copytree(local_run, dest, symlinks=True)  # copy2: mtimes kept
    for removed in REMOVED:
        path = dest / removed
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    planned = plan(dest, *TARGETS)
    if rule_counts(planned) != SLURM_RULES:
        pytest.fail(
            f"the copy of the local run plans {dict(rule_counts(planned))}, not {SLURM_RULES}:\n"
            + "\n".join(f"{job.rule} {job.wildcards}: {job.reason}" for job in planned)
        )
    return dest


@pytest.fixture(scope="module")
def scenario(
    cluster: LocalSlurm, workflow_run: Path, tmp_path_factory: pytest.TempPathFactory
) -> Scenario:
    seconds = {"apt_install": cluster.install_seconds, "cluster_start": cluster.start_seconds}

    started = time.monotonic()
    workdir = copy_without_slurm_jobs(workflow_run, tmp_path_factory.mktemp("slurm") / "wf")
    seconds["copy_and_plan"] = time.monotonic() - started
    started = time.monotonic()
    marker = workdir.parent / "paused-mid-write"
    proc, log = _start(cluster, workdir, "cancelled", _pause_env(marker))
    job_id = _wait_running(cluster, proc, log, marker)
    # besides the writer's own partial store (its temporary sibling), junk at the output path
    partial = workdir / CANCELLED_OUTPUT
    partial.mkdir(parents=True, exist_ok=True)
    (partial / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"')  # truncated
    cancel_time = time.monotonic()
    cluster.run("scancel", job_id)
    cancelled = _finish(proc, log, started, NOTICE_CANCEL_S)
    seconds["slurm_until_cancel"] = cancel_time - started
    seconds["cancel_noticed_after"] = time.monotonic() - cancel_time

    partial_after_failure = partial.exists()
    planned = plan(workdir, *TARGETS)

    started = time.monotonic()
    proc, log = _start(cluster, workdir, "rerun")
    rerun = _finish(proc, log, started, RUN_TIMEOUT_S)
    seconds["slurm_rerun"] = rerun.seconds
    print(  # shown with -s / -rP: where the minutes go
        f"\nSLURM test ({cluster.accounting} accounting): "
        + ", ".join(f"{what} {value:.0f} s" for what, value in seconds.items())
    )
    return Scenario(
        cluster,
        workdir,
        cancelled,
        job_id,
        partial_after_failure,
        planned,
        rerun,
        job_table(cluster),
    )


def test_cancelled_job_is_reported_failed(scenario: Scenario) -> None:
    run = scenario.cancelled
    assert run.returncode != 0, run.output[-4000:]
    assert f"SLURM-job '{scenario.cancelled_job}' failed" in run.output, run.output[-4000:]
    assert "CANCELLED" in run.output
    states = {job["id"]: job["state"] for job in scenario.jobs}
    assert states[scenario.cancelled_job].startswith("CANCELLED")


def job_stats(output: str) -> dict[str, int]:
    """Snakemake's "Job stats" table (rule -> job count) from a run's output."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == ["job", "count"])
    counts = {}
    for line in lines[start + 2 :]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def test_partial_output_is_not_taken_as_complete(scenario: Scenario) -> None:
    # Whatever the killed job left at its output path, the next run schedules the job again
    # (and what depends on it), and nothing else.
    assert rule_counts(scenario.planned) == SLURM_RULES
    # Snakemake removed what the killed job left (or flags it incomplete): never a finished store
    reason = "Missing output files" if not scenario.partial_after_failure else "Incomplete"
    (cancelled,) = [job for job in scenario.planned if job.rule == CANCELLED_RULE]
    assert reason in cancelled.reason


def test_rerun_completes_the_workflow(scenario: Scenario) -> None:
    run = scenario.rerun
    assert run.returncode == 0, run.output[-6000:] + scenario.cluster.diagnostics()
    assert job_stats(run.output) == SLURM_RULES
    for target in TARGETS:
        assert (scenario.workdir / target).exists()


def test_gpu_rule_store_is_bitwise_identical_to_the_local_run(
    scenario: Scenario, workflow_run: Path
) -> None:
    # the SLURM job's store, written in the rerun (the copy lost the local run's)
    assert list(zarr.open_group(workflow_run / CANCELLED_OUTPUT, mode="r").array_keys())
    assert_same_arrays(workflow_run / CANCELLED_OUTPUT, scenario.workdir / CANCELLED_OUTPUT)


def test_metrics_equal_the_local_run(scenario: Scenario, workflow_run: Path) -> None:
    assert json.loads((scenario.workdir / METRICS).read_text()) == json.loads(
        (workflow_run / METRICS).read_text()
    )


def minutes(timelimit: str) -> int:
    """SLURM's [D-]HH:MM:SS (or MM:SS) time limit in minutes."""
    days, _, clock = timelimit.rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return int(days or 0) * 1440 + seconds // 60


def test_jobs_ran_with_the_profile_resources(scenario: Scenario) -> None:
    """Partition, time limit and CPUs of every SLURM job come from the profile and the rules."""
    profile = _profile()
    by_rule = {}
    for job in scenario.jobs:
        rule = job["comment"].removeprefix("rule_").split("_wildcards_")[0]
        by_rule.setdefault(rule, []).append(job)
    # only the jobs the copy lacks ran under SLURM; the cancelled one twice (cancelled, rerun)
    assert {rule: len(jobs) for rule, jobs in by_rule.items()} == {
        CANCELLED_RULE: 2,
        "compute_metrics": 1,
    }
    partition = profile["default-resources"]["slurm_partition"]
    for rule, jobs in by_rule.items():
        runtime = (
            profile["set-resources"]
            .get(rule, {})
            .get("runtime", profile["default-resources"]["runtime"])
        )
        for job in jobs:
            assert job["partition"] == partition
            assert minutes(job["timelimit"]) == int(runtime), (rule, job)
    assert {job["cpus"] for job in by_rule[CANCELLED_RULE]} == {"1"}  # the rule's threads

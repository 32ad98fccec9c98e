"""The SLURM profile against a real single-node SLURM (slurmctld, slurmd, slurmdbd, MariaDB).

Targets (a subset of config/test.yaml, to stay within minutes): ``results/datasets/binding.zarr``
and ``results/metrics/simclr.json``, i.e. the jobs render_binding, train_zoo[simclr],
extract_embeddings[simclr] (a GPU rule, mapped to CPU here) and compute_metrics[simclr].

Scenario, shared by the tests of this module:
1. the reference: the session's local run of config/test.yaml (``workflow_run``, shared with
   the workflow tests), which holds the same jobs on the same config;
2. in another copy, ``snakemake --workflow-profile profiles/slurm`` (plus the CPU override) until
   the extract_embeddings job runs under SLURM; the test then leaves a partial store at the job's
   output path (what a writer killed mid-write leaves) and kills the job with ``scancel``;
   Snakemake must report the job failed and exit non-zero;
3. a dry run must schedule the cancelled job again (its partial output is not taken as done)
   and keep the jobs that completed;
4. the same SLURM command again completes the workflow; its results equal the local run's,
   bitwise for the zarr stores and the zoo checkpoint.

Skips, with the reason, only where SLURM cannot be installed (not root, no apt-get, packages not
installable). Run alone with ``pytest -m slurm``.
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

from tests.conftest import REPO, copy_workflow
from tests.outputs import assert_same_arrays, assert_same_safetensors
from tests.planning import Planned, plan, rule_counts
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
TARGETS = ("results/datasets/binding.zarr", "results/metrics/simclr.json")
CANCELLED_RULE = "extract_embeddings"
CANCELLED_OUTPUT = "results/embeddings/simclr.zarr"
CANCELLED_LOG = "logs/extract_embeddings/simclr.log"
RUN_TIMEOUT_S = 900
NOTICE_CANCEL_S = 240  # status checks back off to at most 180 s (the plugin's cap)


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
def cluster() -> LocalSlurm:
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
    exe = str(Path(sys.executable).with_name("snakemake"))
    status = ["--slurm-status-command", "squeue"] if slurm.accounting == "squeue" else []
    return [
        exe,
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


def _start(slurm: LocalSlurm, workdir: Path, name: str) -> tuple[subprocess.Popen, Path]:
    log = workdir.parent / f"{workdir.name}-{name}.log"
    with open(log, "w") as stream:
        proc = subprocess.Popen(
            _slurm_command(slurm),
            cwd=workdir,
            env=_env(slurm),
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


def _wait_running(slurm: LocalSlurm, proc: subprocess.Popen, log: Path, workdir: Path) -> str:
    """The SLURM id of the CANCELLED_RULE job once its script writes its log."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"snakemake exited ({proc.returncode}) before {CANCELLED_RULE} ran:\n"
                f"{log.read_text()[-6000:]}\n{slurm.diagnostics()}"
            )
        log_file = workdir / CANCELLED_LOG
        script_started = log_file.is_file() and log_file.stat().st_size > 0
        for job in live_jobs(slurm):
            ours = job["comment"].startswith(f"rule_{CANCELLED_RULE}")
            if ours and job["state"] == "RUNNING" and script_started:
                return job["id"]
        time.sleep(0.5)
    pytest.fail(f"{CANCELLED_RULE} never ran under SLURM:\n{log.read_text()[-6000:]}")


@pytest.fixture(scope="module")
def scenario(cluster: LocalSlurm, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    seconds = {"apt_install": cluster.install_seconds, "cluster_start": cluster.start_seconds}

    workdir = copy_workflow(tmp_path_factory.mktemp("slurm") / "wf")
    started = time.monotonic()
    proc, log = _start(cluster, workdir, "cancelled")
    job_id = _wait_running(cluster, proc, log, workdir)
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
    # (and what depends on it) and keeps the jobs that completed under SLURM before the cancel.
    assert rule_counts(scenario.planned) == {CANCELLED_RULE: 1, "compute_metrics": 1}
    # Snakemake removed what the killed job left (or flags it incomplete): never a finished store
    reason = "Missing output files" if not scenario.partial_after_failure else "Incomplete"
    (cancelled,) = [job for job in scenario.planned if job.rule == CANCELLED_RULE]
    assert reason in cancelled.reason


def test_rerun_completes_the_workflow(scenario: Scenario) -> None:
    run = scenario.rerun
    assert run.returncode == 0, run.output[-6000:] + scenario.cluster.diagnostics()
    assert job_stats(run.output) == {CANCELLED_RULE: 1, "compute_metrics": 1}
    for target in TARGETS:
        assert (scenario.workdir / target).exists()


@pytest.mark.parametrize("store", ["results/datasets/binding.zarr", CANCELLED_OUTPUT])
def test_stores_are_bitwise_identical_to_a_local_run(
    scenario: Scenario, workflow_run: Path, store: str
) -> None:
    assert list(zarr.open_group(workflow_run / store, mode="r").array_keys())
    assert_same_arrays(workflow_run / store, scenario.workdir / store)


def test_zoo_checkpoint_and_metrics_equal_the_local_run(
    scenario: Scenario, workflow_run: Path
) -> None:
    weights = "results/zoo/simclr/model.safetensors"
    assert_same_safetensors(workflow_run / weights, scenario.workdir / weights)
    metrics = "results/metrics/simclr.json"
    assert json.loads((scenario.workdir / metrics).read_text()) == json.loads(
        (workflow_run / metrics).read_text()
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
    assert set(by_rule) == {"render_binding", "train_zoo", CANCELLED_RULE, "compute_metrics"}
    assert len(by_rule[CANCELLED_RULE]) == 2  # cancelled, then rerun
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

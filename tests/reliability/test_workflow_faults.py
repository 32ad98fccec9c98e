"""Faults of whole workflow runs, on config/test.yaml: the shared run (``workflow_run``) is the
uninterrupted reference each test copies.

- SIGKILL in the middle of each long stage: the rerun completes and equals an uninterrupted run;
- a second run started on the same directory while the first runs: refused by Snakemake's lock;
- the same config and seed twice: bitwise identical outputs of every stage, and the same
  tables and figures when they are recomputed; provenance.

Fault points are deterministic (``killpoints/sitecustomize.py``): the job kills itself at a
chosen training step, image count, Jacobian chunk or store write. Two scopes: the job process
only (a cluster job killed by the scheduler; Snakemake survives and sees a failed job), and the
whole run (node failure: Snakemake dies too, its lock and incomplete markers stay behind).
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import zarr

from repdiag.core.errors import StoreError
from repdiag.core.store import open_store
from tests.conftest import REPO, copy_workflow, snakemake, snakemake_command, snakemake_env
from tests.outputs import assert_same_output
from tests.planning import plan

KILLPOINTS = Path(__file__).resolve().parent / "killpoints"
JACOBIAN_CACHE = "results/jacobians/.cache"


@dataclass(frozen=True)
class Stage:
    target: str  # the file asked of Snakemake
    outputs: tuple[str, ...]  # everything the job declares
    fault_at: str  # REPDIAG_FAULT_AT, see killpoints/sitecustomize.py


STAGES = {
    "train_zoo": Stage(
        "results/zoo/mae/model.safetensors",
        (
            "results/zoo/mae/model.safetensors",
            "results/zoo/mae/meta.json",
            "results/zoo/mae/curve.csv",
        ),
        "progress:train_zoo mae (mae):2",  # step 2 of 3
    ),
    "extract_embeddings": Stage(
        "results/embeddings/mae.zarr",
        ("results/embeddings/mae.zarr",),
        "progress:mae embeddings:100",  # batch 4 of 9 (image 128 of 264)
    ),
    "extract_embeddings, writing the store": Stage(
        "results/embeddings/mae.zarr",
        ("results/embeddings/mae.zarr",),
        "store:embeddings/.mae.zarr.tmp:4",  # 4th metadata/chunk write into the new store
    ),
    "jacobian_spectra": Stage(
        "results/jacobians/mae.zarr",
        ("results/jacobians/mae.zarr", "results/jacobians/mae.json"),
        "progress:mae Jacobian spectra:2",  # after 1 of 2 chunks of 2 images
    ),
    "identifiability_cell": Stage(
        "results/identifiability/identity-full-mlp-infonce-s0.json",
        (
            "results/identifiability/identity-full-mlp-infonce-s0.json",
            "results/identifiability/identity-full-mlp-infonce-s0.curve.csv",
        ),
        "progress:contrastive steps:20",  # step 20 of 40
    ),
    "alignment_cell": Stage(
        "results/alignment/cosae-all__p1__s0.json",
        ("results/alignment/cosae-all__p1__s0.json",),
        "progress:training cosae:30",  # step 30 of 60
    ),
}


def fault_env(stage: Stage, scope: str, marker: Path, fault: str = "kill", **extra: str) -> dict:
    return {
        "PYTHONPATH": str(KILLPOINTS),
        "REPDIAG_FAULT": fault,
        "REPDIAG_FAULT_AT": stage.fault_at,
        "REPDIAG_FAULT_SCOPE": scope,
        "REPDIAG_FAULT_MARKER": str(marker),
        **extra,
    }


@pytest.fixture
def reference(workflow_run: Path) -> Path:
    """The uninterrupted run: the session's run of config/test.yaml, shared with the workflow
    tests (tests.shared_runs); each test copies it."""
    return workflow_run


def without_outputs(reference: Path, stage: Stage, dest: Path) -> Path:
    """A copy of the reference run with the stage's outputs (and the Jacobian cache) removed."""
    shutil.copytree(reference, dest, symlinks=True)
    for out in (*stage.outputs, JACOBIAN_CACHE):
        path = dest / out
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return dest


def assert_nothing_looks_complete(workdir: Path, stage: Stage) -> None:
    for out in stage.outputs:
        path = workdir / out
        if path.suffix == ".zarr" and path.exists():
            with pytest.raises(StoreError):
                open_store(path)
        else:
            assert not path.exists(), f"{out} exists after the job was killed"


# Every stage is killed with the whole run (node failure: Snakemake dies too); the job alone
# (Snakemake sees a failed job) in one stage, the Jacobians, whose chunk cache must be reused
# after it: what Snakemake does then does not depend on the stage, and a writer killed with the
# whole run is killed exactly as one killed alone (SIGKILL to its process).
# The refused rerun (the message telling the user to --unlock) and `--unlock` itself are shown
# on one stage: they are Snakemake's answer to the lock left behind, which every stage's kill is
# checked to leave; the other stages lift it as --unlock does (one Snakemake start saved each).
REFUSAL_SHOWN_ON = "train_zoo"
KILLS = [
    *((name, "all") for name in STAGES),
    ("jacobian_spectra", "job"),  # the chunk cache is reused after a job-only kill too
]


@pytest.mark.parametrize(("name", "scope"), KILLS)
def test_killed_stage_reruns_to_the_uninterrupted_result(
    reference: Path, tmp_path: Path, name: str, scope: str
) -> None:
    stage = STAGES[name]
    workdir = without_outputs(reference, stage, tmp_path / "run")
    marker = tmp_path / "fault-reached"

    killed = snakemake(
        workdir,
        stage.target,
        check=False,
        env=fault_env(stage, scope, marker),
        start_new_session=True,
    )
    assert marker.exists(), f"the kill point was never reached\n{killed.stderr[-3000:]}"
    assert killed.returncode != 0
    assert_nothing_looks_complete(workdir, stage)

    if scope == "all":  # Snakemake died with the job: its lock stays and must be lifted by hand
        assert any((workdir / ".snakemake" / "locks").iterdir()), "no lock left behind"
        if name == REFUSAL_SHOWN_ON:  # what the user sees is the same for every stage
            refused = snakemake(workdir, stage.target, check=False)
            assert refused.returncode != 0
            assert "--unlock" in refused.stdout + refused.stderr
            snakemake(workdir, "--unlock")
            assert not (workdir / ".snakemake" / "locks").exists()  # what the else branch does
        else:
            shutil.rmtree(workdir / ".snakemake" / "locks")
    snakemake(workdir, stage.target)

    for out in stage.outputs:
        assert_same_output(reference / out, workdir / out)
    if name == "jacobian_spectra":
        log = (workdir / "logs" / "jacobian_spectra" / "mae.log").read_text()
        assert "reused 1 cached chunks of 2" in log
        assert not (workdir / JACOBIAN_CACHE / "mae").exists()  # dropped once the store is written


def test_a_second_run_on_the_same_directory_is_refused_by_the_lock(
    reference: Path, tmp_path: Path
) -> None:
    stage = STAGES["alignment_cell"]
    workdir = without_outputs(reference, stage, tmp_path / "run")
    running, release = tmp_path / "running", tmp_path / "release"
    env = fault_env(stage, "job", running, fault="pause", REPDIAG_FAULT_RELEASE=str(release))
    first = subprocess.Popen(
        snakemake_command(stage.target),
        cwd=workdir,
        env=snakemake_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 1200  # a hang guard, far beyond a busy machine's start
        while not running.exists():  # the first run's job is paused mid-training
            assert first.poll() is None, first.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the first run never reached its job"
            time.sleep(0.1)
        second = snakemake(workdir, stage.target, check=False)
        assert second.returncode != 0
        assert "cannot be locked" in second.stdout + second.stderr
    finally:
        release.touch()
        first_output = first.communicate(timeout=1800)[0]  # hang guard
    assert first.returncode == 0, first_output[-3000:]
    for out in stage.outputs:
        assert_same_output(reference / out, workdir / out)
    assert plan(workdir, stage.target) == []


def test_the_dataset_rendered_again_from_scratch_is_bitwise_identical(
    reference: Path, tmp_path: Path
) -> None:
    """The same config and seed twice give bitwise identical outputs, stage by stage: the dataset
    here; zoo training, extraction, an identifiability and an alignment cell from scratch in the
    kill tests' reruns and the Jacobians chunk by chunk there, each against the shared run; every
    metric, real pair, table and figure in the rerun below."""
    workdir = copy_workflow(tmp_path / "again")
    snakemake(workdir, "results/datasets/binding.zarr")
    assert_same_output(
        reference / "results/datasets/binding.zarr", workdir / "results/datasets/binding.zarr"
    )


def test_a_rerun_gives_the_same_results_tables_and_figures(
    workflow_run: Path, second_run: Path
) -> None:
    """Every file under results/ of config/test.yaml's run equals the same run with every metric,
    real-pair alignment, table, figure and summary recomputed (``tests.conftest.RECOMPUTED``):
    tables, figures (PNG and PDF), summary.md and ols_summary.txt byte for byte; stores and JSON
    with only the wall times, rates and creation stamps of ``tests.outputs.VOLATILE`` left out."""
    workdir = second_run
    assert workdir != workflow_run
    tables = sorted((workflow_run / "results" / "tables").iterdir())
    figures = sorted((workflow_run / "results" / "figures").glob("*.pdf"))
    assert len(tables) >= 10 and len(figures) >= 5  # the comparison below covers them
    assert_same_output(workflow_run / "results", workdir / "results")


@pytest.mark.parametrize("store", ["datasets/binding", "embeddings/mae", "jacobians/mae"])
def test_stores_record_package_versions_and_the_git_commit(reference: Path, store: str) -> None:
    provenance = zarr.open_group(reference / "results" / f"{store}.zarr", mode="r").attrs[
        "provenance"
    ]
    assert {"numpy", "torch", "zarr", "xarray"} <= set(provenance["packages"])
    for package, version in provenance["packages"].items():
        assert version == importlib.metadata.version(package)
    if (REPO / ".git").exists():
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        assert provenance["git_commit"] == head

"""SIGKILL in the middle of each long stage: the rerun completes and equals an uninterrupted run.

Fault points are deterministic (``killpoints/sitecustomize.py``): the job kills itself at a
chosen training step, image count, Jacobian chunk or store write. Two scopes: the job process
only (a cluster job killed by the scheduler; Snakemake survives and sees a failed job), and the
whole run (node failure: Snakemake dies too, its lock and incomplete markers stay behind).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from repdiag.errors import StoreError
from repdiag.store import open_store
from tests.conftest import copy_workflow, edit_config, snakemake
from tests.reliability.outputs import assert_same_output

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
        "progress:train_zoo mae (mae):10",  # step 10 of 20
    ),
    "extract_embeddings": Stage(
        "results/embeddings/mae.zarr",
        ("results/embeddings/mae.zarr",),
        "progress:mae embeddings:100",  # image 100 of 264
    ),
    "extract_embeddings, writing the store": Stage(
        "results/embeddings/mae.zarr",
        ("results/embeddings/mae.zarr",),
        "store:embeddings/.mae.zarr.tmp:4",  # 4th metadata/chunk write into the new store
    ),
    "jacobian_spectra": Stage(
        "results/jacobians/mae.zarr",
        ("results/jacobians/mae.zarr", "results/jacobians/mae.json"),
        "progress:mae Jacobian spectra:4",  # after 2 of 4 chunks of 2 images
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
STAGE_OUTPUTS = sorted({out for stage in STAGES.values() for out in stage.outputs})
REFERENCE_TARGETS = [*STAGE_OUTPUTS, "results/metrics/mae.json"]


def slower_stages(config: dict) -> None:
    """Enough steps, batches and chunks in each stage for a kill point in the middle."""
    config["zoo"]["objectives"]["mae"]["steps"] = 20
    config["embeddings"]["batch_size"] = 2
    config["jacobians"]["chunk_size"] = 2
    config["jacobians"]["probes"] = {"binding": {"n": 4}, "noise": {"n": 4, "std": 0.25}}


def fault_env(stage: Stage, scope: str, marker: Path, fault: str = "kill", **extra: str) -> dict:
    return {
        "PYTHONPATH": str(KILLPOINTS),
        "REPDIAG_FAULT": fault,
        "REPDIAG_FAULT_AT": stage.fault_at,
        "REPDIAG_FAULT_SCOPE": scope,
        "REPDIAG_FAULT_MARKER": str(marker),
        **extra,
    }


def prepare(workdir: Path) -> Path:
    copy_workflow(workdir)
    edit_config(workdir, slower_stages)
    return workdir


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run of every stage's target (and the metrics that read them)."""
    workdir = prepare(tmp_path_factory.mktemp("uninterrupted"))
    snakemake(workdir, *REFERENCE_TARGETS)
    return workdir


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


@pytest.mark.parametrize("scope", ["job", "all"])
@pytest.mark.parametrize("name", list(STAGES))
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
        refused = snakemake(workdir, stage.target, check=False)
        assert refused.returncode != 0
        assert "--unlock" in refused.stdout + refused.stderr
        snakemake(workdir, "--unlock")
    snakemake(workdir, stage.target)

    for out in stage.outputs:
        assert_same_output(reference / out, workdir / out)
    if name == "jacobian_spectra":
        log = (workdir / "logs" / "jacobian_spectra" / "mae.log").read_text()
        assert "reused 2 cached chunks of 4" in log
        assert not (workdir / JACOBIAN_CACHE / "mae").exists()  # dropped once the store is written

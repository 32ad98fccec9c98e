"""benchmarks/gpu_e2e.sh in its CPU mode (over the shared test run, GPU-only checks SKIP), and
its log reading, slot check and config against constructed cases."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repdiag.core.config import load_config

# a workflow test: scheduled after the unit tests, when the shared run it copies is built (an
# xdist_group would schedule it first, holding a worker idle while that run builds)
pytestmark = pytest.mark.workflow

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("gpu_e2e", ROOT / "benchmarks/gpu_e2e.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


e2e = _module()


@pytest.fixture(scope="module")
def cpu_run(workflow_run: Path, tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """gpu_e2e.sh in CPU mode over a copy of the shared run of config/test.yaml: its DAG is
    complete, so Snakemake has nothing left to run (the 17 jobs of the reduced config cost 80 s
    of the suite's 12 minutes; `--tiny` alone runs them, and did at b5b3614, 42 s on 2 cores),
    and every check and measurement runs over the jobs that run made."""
    import shutil

    folder = tmp_path_factory.mktemp("e2e")
    work = shutil.copytree(workflow_run, folder / "work", symlinks=True)
    out = folder / "e2e.json"
    env = {**os.environ, "REPDIAG_PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu_e2e.sh"), "--cores", "2", "--workdir", str(work),
         "--config", "config/test.yaml", "--check-model", "simclr", "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=1800, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads(out.read_text())


def test_the_cpu_mode_checks_a_run_and_skips_the_gpu_checks(cpu_run) -> None:
    done, result = cpu_run
    assert result["gpus"] == 0 and result["failed"] == []
    for check in ("device", "slots", "utilisation"):
        assert f"{check}: SKIP" in done.stdout
    assert "cuda_vs_cpu: ok" in done.stdout
    stores = result["device"]["stores"]
    models = {"barlow_twins", "mae", "simclr", "clip", "supervised", "dose"}
    assert set(stores["embeddings"]) == set(stores["jacobians"]) == models
    assert {d for stage in stores.values() for d in stage.values()} == {"cpu"}
    assert result["cuda_vs_cpu"]["max_rel_diff"] <= e2e.JER_RTOL
    assert result["cuda_vs_cpu"]["layers"] == ["final", "head"]  # simclr's projection head
    assert set(result["zoo_steps_per_s"]) >= {"simclr", "dose", "dose-step2"}
    assert all(rate > 0 for rate in result["zoo_steps_per_s"].values())
    assert any(name.startswith("jacobian_spectra/") for name in result["jobs"])
    assert result["gpu_job_s"] == 0  # no slot was held


@pytest.mark.parametrize("tiny", [True, False])
def test_the_config_is_valid(tmp_path: Path, tiny: bool) -> None:
    path = e2e.prepare(tmp_path, e2e.e2e_config(tiny))
    config = load_config(path)
    assert config["jacobians"]["precision"] == "fp32"  # CUDA against CPU in float32
    assert ("clip_vit_b32" in config["models"]) is not tiny


def _log(folder: Path, rule: str, name: str, lines: list[str]) -> None:
    (folder / rule).mkdir(parents=True, exist_ok=True)
    (folder / rule / f"{name}.log").write_text("\n".join(lines) + "\n")


def test_jobs_and_holds_are_read_from_the_logs(tmp_path: Path) -> None:
    day = "2026-12-05 10:00"
    _log(tmp_path, "jacobian_spectra", "a", [
        f"{day}:00,000 INFO repdiag.core.gpu: holding GPU slot of device 0 in /x (CUDA_VISIBLE_DEVICES=0)",
        "a line without a stamp",
        f"{day}:05,500 INFO repdiag.core.gpu: released GPU slot of device 0",
        f"{day}:06,000 INFO repdiag: wrote",
    ])  # fmt: skip
    _log(tmp_path, "compute_metrics", "a", [f"{day}:07,000 INFO x", f"{day}:09,000 INFO y"])
    jobs = {f"{j['rule']}/{j['name']}": j for j in e2e.job_windows(tmp_path)}
    assert jobs["jacobian_spectra/a"]["end"] - jobs["jacobian_spectra/a"]["start"] == 6.0
    assert [h[0] for h in jobs["jacobian_spectra/a"]["holds"]] == ["0"]
    _device, start, end = jobs["jacobian_spectra/a"]["holds"][0]
    assert end - start == 5.5
    assert jobs["compute_metrics/a"]["holds"] == []


def test_the_slot_check_fails_on_overlap_and_on_more_holds_than_gpus() -> None:
    def job(*holds):
        return {"holds": list(holds)}

    apart = [job(("0", 0.0, 1.0)), job(("0", 1.0, 2.0)), job(("1", 0.5, 1.5))]
    assert e2e.slot_check(apart, gpus=2) == {
        "holds": 3, "most_at_once": 2, "overlaps": 0, "ok": True,
    }  # fmt: skip
    assert not e2e.slot_check(apart, gpus=1)["ok"]  # two held at once on one GPU
    shared = [job(("0", 0.0, 2.0)), job(("0", 1.0, 3.0))]
    assert e2e.slot_check(shared, gpus=2)["overlaps"] == 1
    assert not e2e.slot_check(shared, gpus=2)["ok"]


def test_utilisation_while_only_training_ran() -> None:
    zoo = {"start": 0.0, "end": 10.0}
    other = {"start": 5.0, "end": 20.0}
    samples = [(1.0, 80.0), (4.0, 60.0), (6.0, 10.0), (15.0, 30.0)]
    result = e2e.utilisation(samples, [zoo], [zoo, other])
    assert result["samples"] == 4
    assert result["mean_percent"] == 45.0
    assert result["zoo_only_mean_percent"] == 70.0

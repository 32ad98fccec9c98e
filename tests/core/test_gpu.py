"""GPU slots (concurrent jobs get distinct devices; a crashed job frees its slot) and numerics
(TF32, bfloat16 autocast, deterministic algorithms). No GPU needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repdiag.core.errors import ConfigError
from repdiag.core.gpu import (
    autocast,
    effective_precision,
    gpu_slot,
    numerics,
    numerics_record,
    visible_devices,
)

HOLDER = """
import os, sys, time
from repdiag.core.gpu import gpu_slot
with gpu_slot(poll_s=0.05) as device:
    with open(sys.argv[1], "w") as out:
        out.write(f"{device} {os.environ.get('CUDA_VISIBLE_DEVICES')}")
    time.sleep(float(sys.argv[2]))
"""


def start_holder(
    tmp_path: Path, name: str, hold_s: float, devices: str
) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"{name}.txt"
    env = {
        **os.environ,
        "REPDIAG_GPU_DEVICES": devices,
        "REPDIAG_GPU_SLOT_DIR": str(tmp_path / "slots"),
    }
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out), str(hold_s)], env=env)
    return proc, out


def wait_for(path: Path, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_concurrent_jobs_receive_distinct_devices(tmp_path):
    holders = [start_holder(tmp_path, f"job{i}", 3.0, "0,1,2") for i in range(3)]
    seen = [wait_for(out).split() for _, out in holders]
    for proc, _ in holders:
        assert proc.wait(timeout=30) == 0
    devices = [device for device, _ in seen]
    assert sorted(devices) == ["0", "1", "2"]
    assert all(device == visible for device, visible in seen)


def test_a_job_waits_while_every_device_is_held(tmp_path):
    first, first_out = start_holder(tmp_path, "first", 1.5, "0")
    assert wait_for(first_out).split()[0] == "0"
    started = time.monotonic()
    second, second_out = start_holder(tmp_path, "second", 0.0, "0")
    assert wait_for(second_out).split()[0] == "0"
    assert time.monotonic() - started > 0.5  # it had to wait for the first job
    assert first.wait(timeout=30) == 0 and second.wait(timeout=30) == 0


def test_a_killed_job_releases_its_slot(tmp_path):
    victim, victim_out = start_holder(tmp_path, "victim", 60.0, "0")
    assert wait_for(victim_out).split()[0] == "0"
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    survivor, survivor_out = start_holder(tmp_path, "survivor", 0.0, "0")
    assert wait_for(survivor_out, timeout_s=10).split()[0] == "0"
    assert survivor.wait(timeout=30) == 0


def test_no_visible_device_means_cpu_and_environment_is_restored(tmp_path, monkeypatch):
    monkeypatch.setenv("REPDIAG_GPU_DEVICES", "")
    with gpu_slot() as device:
        assert device is None
    monkeypatch.setenv("REPDIAG_GPU_DEVICES", "3")
    monkeypatch.setenv("REPDIAG_GPU_SLOT_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with gpu_slot() as device:
        assert device == "3" and os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


@pytest.mark.parametrize(
    ("value", "expected"), [("0,1", ["0", "1"]), ("-1", []), ("", []), (" 2 , 5", ["2", "5"])]
)
def test_visible_devices_parses_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("REPDIAG_GPU_DEVICES", value)
    assert visible_devices() == expected


def test_slurm_jobs_use_their_allocation_without_a_shared_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("REPDIAG_GPU_SLOT_DIR", str(tmp_path / "slots"))
    with gpu_slot() as device:
        assert device == "0"
    assert not (tmp_path / "slots").exists()


# ---------------------------------------------------------------------------------- numerics


def _tf32_switches_off(record: dict) -> bool:
    """Every set TF32 switch of a record says full float32 (the cuDNN parent is set through its
    conv and rnn children and keeps its value)."""
    return all(
        value in ("ieee", False)
        for name, value in record["tf32"].items()
        if name != "cudnn.fp32_precision"
    )


def test_numerics_sets_tf32_per_precision_and_restores_every_switch(monkeypatch):
    import torch

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = numerics_record()
    assert not _tf32_switches_off(before)  # torch's default: cuDNN convolutions may use TF32
    for precision in ("fp32", "bf16"):
        with numerics(precision, "cpu") as record:
            assert _tf32_switches_off(record) and _tf32_switches_off(numerics_record())
            assert record["precision"] == precision and record["device"] == "cpu"
            assert not record["deterministic_algorithms"]  # CPU: kernels left as they are
        assert numerics_record() == before
    with numerics("tf32", "cuda", capability=(9, 0)) as record:
        switches = {k: v for k, v in record["tf32"].items() if k != "cudnn.fp32_precision"}
        assert switches and set(switches.values()) <= {"tf32", True}
        assert record["precision_effective"] == "tf32"
        assert record["deterministic_algorithms"] and record["deterministic_warn_only"]
        assert torch.are_deterministic_algorithms_enabled()
        assert record["cudnn_deterministic"] and not record["cudnn_benchmark"]
        assert record["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert numerics_record() == before  # the environment variable is gone again too
    assert not torch.are_deterministic_algorithms_enabled()
    with numerics("fp32", "cuda", deterministic=False) as record:
        assert not record["deterministic_algorithms"] and _tf32_switches_off(record)


def test_numerics_restores_the_switches_after_an_error():
    before = numerics_record()
    with pytest.raises(KeyError), numerics("tf32", "cuda", capability=(8, 0)):
        raise KeyError("inside")
    assert numerics_record() == before


@pytest.mark.parametrize(
    ("precision", "device", "capability", "expected"),
    [
        ("fp32", "cuda", (9, 0), "fp32"),
        ("bf16", "cpu", None, "bf16"),
        ("tf32", "cpu", None, "fp32"),  # no TF32 on a CPU
        ("tf32", "cuda:1", (8, 0), "tf32"),  # Ampere and later
        ("tf32", "cuda", (7, 5), "fp32"),  # Turing: no TF32 units
    ],
)
def test_effective_precision(precision, device, capability, expected):
    assert effective_precision(precision, device, capability) == expected


def test_autocast_runs_matmuls_in_bfloat16_for_bf16_only():
    import torch

    a = torch.randn(4, 4)
    with autocast("bf16", "cpu"):
        assert (a @ a).dtype == torch.bfloat16
    for precision in ("fp32", "tf32"):
        with autocast(precision, torch.device("cpu")):
            assert (a @ a).dtype == torch.float32
    with pytest.raises(ConfigError, match=r"unknown precision 'fp16'; choose one of"):
        autocast("fp16", "cpu")
    with pytest.raises(ConfigError, match="unknown precision"), numerics("half"):
        pass

"""GPU slots: concurrent jobs get distinct devices; a crashed job frees its slot. No GPU needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repdiag.core.gpu import gpu_slot, visible_devices

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

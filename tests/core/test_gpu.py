"""GPU slots (concurrent jobs get distinct devices locally, inside a SLURM allocation and in
SLURM batch jobs; devices listed without NVML and without initialising CUDA; a crashed job frees
its slot; a symlinked lock is refused) and numerics (TF32, bfloat16 autocast, deterministic
algorithms). No GPU needed; no outcome depends on the machine's speed: jobs record the order of
their events in a shared log and hold their slot until the test releases them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repdiag.core import gpu as gpu_module
from repdiag.core.errors import ConfigError
from repdiag.core.gpu import (
    DEVICE_VARIABLES,
    autocast,
    count_visible_gpus,
    effective_precision,
    gpu_slot,
    numerics,
    numerics_record,
    slot_dir,
    try_slot,
    visible_devices,
)

HOLDER = """
import os, sys, time
from pathlib import Path
from repdiag.core.gpu import gpu_slot
name, log, release = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
def note(event):
    with open(log, "a") as out:
        out.write(f"{event} {name} {os.environ.get('CUDA_VISIBLE_DEVICES')}\\n")
note("waiting")
with gpu_slot(poll_s=0.02) as device:
    note(f"start:{device}")
    deadline = time.monotonic() + 300  # hang guard only
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    note("end")
"""


class Jobs:
    """Holder processes sharing one event log; each holds its slot until released."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp, self.log, self.procs = tmp_path, tmp_path / "events.log", {}

    def start(self, name: str, **env: str) -> None:
        env = {**os.environ, **env}  # clean_env has set this process's own
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-c", HOLDER, name, str(self.log), str(self.tmp / f"{name}.go")],
            env=env,
        )

    def events(self) -> list[list[str]]:
        return (
            [line.split() for line in self.log.read_text().splitlines()]
            if self.log.exists()
            else []
        )

    def wait_for(self, event: str, name: str, timeout_s: float = 120.0) -> list[str]:
        """The first ``event`` line of ``name`` (event ``start`` matches start:<device>)."""
        deadline = time.monotonic() + timeout_s  # hang guard only
        while time.monotonic() < deadline:
            for line in self.events():
                if line[0].split(":")[0] == event and line[1] == name:
                    return line
            time.sleep(0.02)
        raise AssertionError(f"{name} never logged {event}: {self.events()}")

    def release(self, name: str) -> int:
        (self.tmp / f"{name}.go").touch()
        return self.procs[name].wait(timeout=120)


def clean_env(monkeypatch, **env: str) -> None:
    """No device variable or SLURM job in this process; ``env`` on top (also for children)."""
    for var in (*DEVICE_VARIABLES, "SLURM_JOB_ID", "SLURM_STEP_ID", "REPDIAG_GPU_SLOT_DIR"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)


def test_concurrent_local_jobs_receive_distinct_devices(tmp_path, monkeypatch):
    clean_env(
        monkeypatch, REPDIAG_GPU_SLOT_DIR=str(tmp_path / "slots"), CUDA_VISIBLE_DEVICES="0,1,2"
    )
    jobs = Jobs(tmp_path)
    for i in range(3):
        jobs.start(f"job{i}")
    started = [jobs.wait_for("start", f"job{i}") for i in range(3)]  # all three hold at once
    devices = [line[0].split(":")[1] for line in started]
    assert sorted(devices) == ["0", "1", "2"]
    assert all(line[0] == f"start:{line[2]}" for line in started)  # CUDA_VISIBLE_DEVICES = it
    assert all(jobs.release(f"job{i}") == 0 for i in range(3))


def test_a_job_waits_while_every_device_is_held(tmp_path, monkeypatch):
    clean_env(monkeypatch, REPDIAG_GPU_SLOT_DIR=str(tmp_path / "slots"), REPDIAG_GPU_DEVICES="0")
    jobs = Jobs(tmp_path)
    jobs.start("first")
    jobs.wait_for("start", "first")
    assert try_slot(tmp_path / "slots", ["0"]) is None  # held: nobody else gets it
    (tmp_path / "second.go").touch()  # the second job leaves as soon as it has the slot
    jobs.start("second")
    jobs.wait_for("waiting", "second")
    assert jobs.release("first") == 0 and jobs.procs["second"].wait(timeout=120) == 0
    order = [(event.split(":")[0], name) for event, name, _ in jobs.events()]
    assert order.index(("end", "first")) < order.index(("start", "second"))


def test_a_killed_job_releases_its_slot(tmp_path, monkeypatch):
    clean_env(monkeypatch, REPDIAG_GPU_SLOT_DIR=str(tmp_path / "slots"), REPDIAG_GPU_DEVICES="0")
    jobs = Jobs(tmp_path)
    jobs.start("victim")
    jobs.wait_for("start", "victim")
    assert try_slot(tmp_path / "slots", ["0"]) is None
    jobs.procs["victim"].send_signal(signal.SIGKILL)
    jobs.procs["victim"].wait(timeout=120)
    taken = try_slot(tmp_path / "slots", ["0"])
    assert taken is not None and taken[0] == "0"
    taken[1].close()


def test_jobs_inside_one_salloc_share_its_gpus_out_one_each(tmp_path, monkeypatch):
    """salloc --gpus=2, then snakemake --resources gpu=2: SLURM_JOB_ID is set and both jobs see
    "0,1"; the slots (node-local, of this allocation) give them one GPU each."""
    clean_env(monkeypatch, SLURM_JOB_ID="77", CUDA_VISIBLE_DEVICES="0,1", TMPDIR=str(tmp_path))
    jobs = Jobs(tmp_path)
    jobs.start("a")
    jobs.start("b")
    devices = {jobs.wait_for("start", name)[2] for name in ("a", "b")}
    assert devices == {"0", "1"}
    folders = [p.name for p in tmp_path.glob("repdiag-gpu-slots-*")]
    assert len(folders) == 1 and "-slurm-77-" in folders[0]
    assert jobs.release("a") == 0 and jobs.release("b") == 0


def test_separate_slurm_jobs_never_wait_for_each_other(tmp_path, monkeypatch):
    """Two batch jobs, one GPU each, both seen as device 0: each has its own slot folder."""
    clean_env(monkeypatch, CUDA_VISIBLE_DEVICES="0", TMPDIR=str(tmp_path))
    jobs = Jobs(tmp_path)
    jobs.start("job101", SLURM_JOB_ID="101")
    jobs.start("job102", SLURM_JOB_ID="102")
    assert {jobs.wait_for("start", n)[2] for n in ("job101", "job102")} == {"0"}  # both hold
    assert jobs.release("job101") == 0 and jobs.release("job102") == 0


def test_the_slot_folder_follows_where_the_job_runs(tmp_path, monkeypatch):
    clean_env(monkeypatch)
    assert slot_dir() == Path(".snakemake/gpu-slots")
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_STEP_ID", "2")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    folder = slot_dir()
    assert folder.parent == tmp_path and f"-{os.getuid()}-slurm-5-2-" in folder.name
    monkeypatch.setenv("REPDIAG_GPU_SLOT_DIR", str(tmp_path / "mine"))
    assert slot_dir() == tmp_path / "mine"


def test_no_visible_device_means_cpu_and_environment_is_restored(tmp_path, monkeypatch):
    clean_env(monkeypatch, REPDIAG_GPU_DEVICES="")
    with gpu_slot() as device:
        assert device is None
    clean_env(monkeypatch, REPDIAG_GPU_DEVICES="3", REPDIAG_GPU_SLOT_DIR=str(tmp_path))
    with gpu_slot() as device:
        assert device == "3" and os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        ("REPDIAG_GPU_DEVICES", "0,1", ["0", "1"]),
        ("CUDA_VISIBLE_DEVICES", "-1", []),
        ("CUDA_VISIBLE_DEVICES", "", []),
        ("CUDA_VISIBLE_DEVICES", " 2 , 5", ["2", "5"]),
        ("CUDA_VISIBLE_DEVICES", "GPU-8a1b,GPU-77c0", ["GPU-8a1b", "GPU-77c0"]),
        ("SLURM_STEP_GPUS", "1,3", ["1", "3"]),
        ("SLURM_JOB_GPUS", "2", ["2"]),
    ],
)
def test_visible_devices_parses_the_environment(monkeypatch, var, value, expected):
    clean_env(monkeypatch, **{var: value})
    assert visible_devices() == expected and count_visible_gpus() == len(expected)


def fake_nvidia_smi(folder: Path, script: str) -> None:
    folder.mkdir(exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + script + "\n")
    smi.chmod(0o755)


def test_devices_are_listed_without_nvml_or_environment(tmp_path, monkeypatch):
    """No device variable: nvidia-smi -L; when NVML fails it, /proc/driver/nvidia/gpus."""
    clean_env(monkeypatch, PATH=str(tmp_path / "bin"))
    proc = tmp_path / "proc"
    for bus in ("0000:17:00.0", "0000:65:00.0"):
        (proc / bus).mkdir(parents=True)
    monkeypatch.setattr(gpu_module, "NVIDIA_PROC", proc)
    fake_nvidia_smi(
        tmp_path / "bin",
        "printf 'GPU 0: H200 (UUID: GPU-a)\\nGPU 1: H200 (UUID: GPU-b)\\nGPU 2: H200 (UUID: GPU-c)\\n'",
    )
    assert visible_devices() == ["0", "1", "2"]
    fake_nvidia_smi(tmp_path / "bin", "echo 'NVML: Driver/library version mismatch'; exit 18")
    assert visible_devices() == ["0", "1"]  # from the driver's /proc entries
    (tmp_path / "bin" / "nvidia-smi").unlink()
    assert visible_devices() == ["0", "1"]
    monkeypatch.setattr(gpu_module, "NVIDIA_PROC", tmp_path / "absent")
    assert visible_devices() == [] and count_visible_gpus() == 0


def test_no_cuda_call_before_the_device_is_fixed(tmp_path, monkeypatch):
    """With NVML failing and no device variable, torch's device count would initialise CUDA
    with every GPU visible; the slot never asks torch, so CUDA_VISIBLE_DEVICES still counts."""
    import torch

    calls: list[str] = []

    def recorder(name: str):
        def record(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"torch.{name} called before the job's device was fixed")

        return record

    for name in ("device_count", "is_available", "init", "_lazy_init", "current_device"):
        monkeypatch.setattr(torch.cuda, name, recorder(f"cuda.{name}"))
    monkeypatch.setattr(
        torch._C, "_cuda_getDeviceCount", recorder("_C._cuda_getDeviceCount"), raising=False
    )
    clean_env(monkeypatch, PATH=str(tmp_path / "bin"), REPDIAG_GPU_SLOT_DIR=str(tmp_path / "s"))
    fake_nvidia_smi(tmp_path / "bin", "echo 'NVML: not found'; exit 9")
    (tmp_path / "proc" / "0000:17:00.0").mkdir(parents=True)
    monkeypatch.setattr(gpu_module, "NVIDIA_PROC", tmp_path / "proc")
    assert count_visible_gpus() == 1
    with gpu_slot() as device:
        assert device == "0" and os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert calls == []


IMPORT_ALL = """
import importlib, pkgutil, sys, torch
calls = []
def recorder(name):
    def record(*args, **kwargs):
        calls.append(name)
        return 0
    return record
for name in ("device_count", "is_available", "init", "_lazy_init", "current_device"):
    setattr(torch.cuda, name, recorder(name))
torch._C._cuda_getDeviceCount = recorder("_cuda_getDeviceCount")
import repdiag
for module in pkgutil.walk_packages(repdiag.__path__, "repdiag."):
    importlib.import_module(module.name)
print(sorted(set(calls)))
"""


def test_importing_the_package_never_touches_cuda(tmp_path):
    """Workflow scripts import repdiag before they take their slot: no module may initialise
    CUDA (or count devices) when imported."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


CPU_NUMERICS = """
import sys, torch
from repdiag.core.gpu import numerics
with numerics("fp32", "cpu") as record:
    assert record["deterministic_algorithms"] is False
print("torch._inductor" in sys.modules)
"""


def test_cpu_numerics_leave_the_deterministic_switch_alone(tmp_path):
    """On the CPU the block changes no deterministic switch, so it never calls the setter,
    which imports torch._inductor (2-3 s of every extraction and Jacobian job's start)."""
    done = subprocess.run(
        [sys.executable, "-c", CPU_NUMERICS],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False"


def test_a_cpu_job_takes_no_slot_and_sees_no_gpu(tmp_path, monkeypatch):
    """Small jobs on the CPU (small_jobs_device: cpu) on a GPU machine: no lock held, every GPU
    hidden for the block, the environment restored after it."""
    clean_env(monkeypatch, CUDA_VISIBLE_DEVICES="0,1", REPDIAG_GPU_SLOT_DIR=str(tmp_path / "s"))
    with gpu_slot(device="cpu") as device:
        assert device is None and os.environ["CUDA_VISIBLE_DEVICES"] == ""
        assert not (tmp_path / "s").exists()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    with gpu_slot(device="auto") as device:
        assert device == "0"


def test_a_symlinked_lock_is_refused(tmp_path, monkeypatch):
    clean_env(monkeypatch, REPDIAG_GPU_DEVICES="0", REPDIAG_GPU_SLOT_DIR=str(tmp_path / "slots"))
    (tmp_path / "slots").mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (tmp_path / "slots" / "gpu0.lock").symlink_to(target)
    with pytest.raises(OSError, match="symbolic link; refusing to follow it"), gpu_slot():
        pass
    assert target.read_text() == "keep me\n"


def test_a_hard_linked_lock_and_a_linked_slot_folder_are_refused(tmp_path, monkeypatch):
    """Before: O_NOFOLLOW covered the last component only; a lock hard-linked to a file outside
    had it truncated and a PID written in, and so had a file in a symlinked slot folder."""
    from repdiag.core.errors import ConfigError

    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    clean_env(monkeypatch, REPDIAG_GPU_DEVICES="0", REPDIAG_GPU_SLOT_DIR=str(tmp_path / "slots"))
    (tmp_path / "slots").mkdir()
    os.link(target, tmp_path / "slots" / "gpu0.lock")
    with pytest.raises(ConfigError, match=r"gpu0\.lock is a hard link \(2 names"), gpu_slot():
        pass
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "linked").symlink_to(elsewhere, target_is_directory=True)
    monkeypatch.setenv("REPDIAG_GPU_SLOT_DIR", str(tmp_path / "linked"))
    with pytest.raises(ConfigError, match=r"GPU slot folder .*linked is a symbolic link"):
        with gpu_slot():
            pass
    assert target.read_text() == "keep me\n" and not list(elsewhere.iterdir())


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


# ------------------------------------------------- no silent sharing, no silent CPU (issue 59)


def no_listing(tmp_path: Path, monkeypatch) -> None:
    """Nothing lists a GPU: no device variable, no nvidia-smi, no /proc/driver/nvidia/gpus."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    clean_env(monkeypatch, PATH=str(tmp_path / "bin"), REPDIAG_GPU_SLOT_DIR=str(tmp_path / "s"))
    monkeypatch.setattr(gpu_module, "NVIDIA_PROC", tmp_path / "absent")


def second_job_blocked(folder: Path) -> bool:
    """Whether a second GPU job would wait now: every slot it could take is held."""
    devices = gpu_module._devices_or_unlisted(None, "auto")
    return bool(devices) and try_slot(folder, devices) is None


def test_unlisted_gpus_run_one_job_at_a_time_never_two_on_cuda0(tmp_path, monkeypatch, caplog):
    """torch sees 2 GPUs that nothing lists: every GPU job takes the one slot gpu-unlisted, so
    a second job waits instead of sharing cuda:0 unawares; CUDA_VISIBLE_DEVICES is left alone."""
    import torch

    no_listing(tmp_path, monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert visible_devices() == [] and gpu_module.unlisted_gpus() == 2
    with caplog.at_level("INFO", logger="repdiag.core.gpu"), gpu_slot() as device:
        assert device == gpu_module.UNLISTED and "CUDA_VISIBLE_DEVICES" not in os.environ
        assert (tmp_path / "s" / "gpu-unlisted.lock").read_text() == f"{os.getpid()}\n"
        assert second_job_blocked(tmp_path / "s")
        with pytest.raises(TimeoutError, match="no free GPU slot"):
            with gpu_slot(poll_s=0.01, timeout_s=0.05):
                pass
    assert "one GPU job at a time (slot gpu-unlisted)" in caplog.text
    assert not second_job_blocked(tmp_path / "s")  # released
    # the hold and its release in the job's log (benchmarks/gpu_e2e.py checks holds from them)
    held = [r.getMessage() for r in caplog.records if "GPU slot of device" in r.getMessage()]
    assert held[0].startswith(f"holding GPU slot of device {gpu_module.UNLISTED} ")
    assert held[-1] == f"released GPU slot of device {gpu_module.UNLISTED}"


def test_the_unlisted_check_sees_the_old_silent_sharing_put_back(tmp_path, monkeypatch):
    """The break put back (torch's GPUs ignored when nothing lists them): no slot is taken, two
    jobs would share cuda:0, and the check above fails."""
    import torch

    no_listing(tmp_path, monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(gpu_module, "unlisted_gpus", lambda: 0)
    with gpu_slot() as device:
        assert device is None and not second_job_blocked(tmp_path / "s")


def test_torch_is_not_asked_when_a_variable_names_the_devices(tmp_path, monkeypatch):
    """An empty CUDA_VISIBLE_DEVICES (or REPDIAG_GPU_DEVICES) means no GPU on purpose: torch's
    device count, which would initialise CUDA, is never asked and no slot is taken."""
    import torch

    def never() -> int:
        raise AssertionError("torch.cuda.device_count asked")

    no_listing(tmp_path, monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", never)
    for var in ("CUDA_VISIBLE_DEVICES", "REPDIAG_GPU_DEVICES"):
        monkeypatch.setenv(var, "")
        with gpu_slot() as device:
            assert device is None
        monkeypatch.delenv(var)


def test_a_gpu_job_that_finds_no_gpu_says_so(tmp_path, monkeypatch, caplog):
    import torch

    no_listing(tmp_path, monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with caplog.at_level("WARNING", logger="repdiag.core.gpu"), gpu_slot(device="cuda") as dev:
        assert dev is None
    assert "asked for a GPU (device: cuda) but none is visible" in caplog.text


def smi_listing(tmp_path: Path, count: int) -> None:
    lines = "".join(f"GPU {i}: H100 (UUID: GPU-{i})\\n" for i in range(count))
    fake_nvidia_smi(tmp_path / "bin", f"printf '{lines}'")


def test_slurm_physical_ids_the_job_cannot_see_are_mapped_or_refused(tmp_path, monkeypatch):
    """SLURM_JOB_GPUS=2,3 (physical ids) in a job whose device cgroup shows 2 GPUs as 0,1: the
    job uses 0 and 1; shown 3 GPUs instead, the ids cannot be mapped and the message says what
    to set; without cgroups (all 8 listed) or with nothing listed, the ids stand."""
    no_listing(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURM_JOB_GPUS", "2,3")
    smi_listing(tmp_path, 2)
    assert visible_devices() == ["0", "1"]
    with gpu_slot() as device:
        assert device == "0" and os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    monkeypatch.setenv("SLURM_STEP_GPUS", "1")  # the step's first; an id the job sees stands
    assert visible_devices() == ["1"]
    monkeypatch.setenv("SLURM_STEP_GPUS", "6")  # one named, two seen: refused
    with pytest.raises(ConfigError, match=r"SLURM_STEP_GPUS=6 names 1 GPU"):
        visible_devices()
    monkeypatch.delenv("SLURM_STEP_GPUS")
    smi_listing(tmp_path, 3)
    with pytest.raises(ConfigError, match=r"SLURM_JOB_GPUS=2,3 .*REPDIAG_GPU_DEVICES=0,1"):
        visible_devices()
    smi_listing(tmp_path, 8)
    assert visible_devices() == ["2", "3"]
    (tmp_path / "bin" / "nvidia-smi").unlink()
    assert visible_devices() == ["2", "3"]  # nothing lists the job's GPUs: nothing to check
    monkeypatch.setenv("SLURM_JOB_GPUS", "GPU-8a1b")
    smi_listing(tmp_path, 1)
    assert visible_devices() == ["GPU-8a1b"]  # a UUID is not a physical ordinal


def test_the_slurm_check_sees_the_unmapped_ids_put_back(tmp_path, monkeypatch):
    """The break put back (SLURM's ids taken as they are): the job would be given
    CUDA_VISIBLE_DEVICES=2, a device its cgroup hides, and the mapping check above fails."""
    no_listing(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURM_JOB_GPUS", "2,3")
    smi_listing(tmp_path, 2)
    monkeypatch.setattr(gpu_module, "slurm_devices", lambda var, value: gpu_module._id_list(value))
    with gpu_slot() as device:
        assert device == "2" and os.environ["CUDA_VISIBLE_DEVICES"] not in ("0", "1")

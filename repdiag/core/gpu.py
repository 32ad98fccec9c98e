"""GPU placement for concurrent jobs: one lock-file slot per visible device.

Snakemake counts a ``gpu`` resource but never assigns device ids (snakemake issue 281), so every
job would land on ``cuda:0``. A GPU job takes an exclusive ``flock`` on one slot file per device
for its lifetime and sets ``CUDA_VISIBLE_DEVICES`` to that device before CUDA initialises. The
kernel releases a ``flock`` when its process dies, so a crashed or killed job frees its slot.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

SLOT_DIR_ENV = "REPDIAG_GPU_SLOT_DIR"
DEVICES_ENV = "REPDIAG_GPU_DEVICES"  # comma-separated ids; overrides detection (tests, clusters)


def visible_devices() -> list[str]:
    """Device ids this job may use: $REPDIAG_GPU_DEVICES, else $CUDA_VISIBLE_DEVICES, else torch."""
    for var in (DEVICES_ENV, "CUDA_VISIBLE_DEVICES"):
        value = os.environ.get(var)
        if value is not None:
            return [d.strip() for d in value.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        return []


def count_visible_gpus() -> int:
    """Number of usable GPUs without importing torch (the Snakefile calls this on every parse)."""
    for var in (DEVICES_ENV, "CUDA_VISIBLE_DEVICES"):
        value = os.environ.get(var)
        if value is not None:
            return len([d for d in value.split(",") if d.strip() and d.strip() != "-1"])
    driver = Path("/proc/driver/nvidia/gpus")
    return len(list(driver.iterdir())) if driver.is_dir() else 0


def _slot_dir() -> Path:
    return Path(os.environ.get(SLOT_DIR_ENV, ".snakemake/gpu-slots"))


@contextlib.contextmanager
def gpu_slot(
    devices: list[str] | None = None, poll_s: float = 0.5, timeout_s: float = 86400.0
) -> Iterator[str | None]:
    """Hold one free device for the block and expose only it through ``CUDA_VISIBLE_DEVICES``.

    Yields the device id, or ``None`` (after logging it) when no GPU is visible, in which case the
    job runs on CPU. Blocks, polling, while every device is held by other jobs.
    """
    if os.environ.get("SLURM_JOB_ID") and devices is None:
        # SLURM already gave this job its own GPUs (every job sees them as 0..n-1): no lock.
        log.info("SLURM job %s: using the GPUs SLURM allocated", os.environ["SLURM_JOB_ID"])
        yield os.environ.get("CUDA_VISIBLE_DEVICES") or None
        return
    devices = visible_devices() if devices is None else devices
    if not devices:
        log.debug(
            "no CUDA device visible: no GPU slot to take"
        )  # select_device logs the CPU fallback
        yield None
        return
    slot_dir = _slot_dir()
    slot_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    while True:
        for device in devices:
            handle = open(slot_dir / f"gpu{device}.lock", "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            previous = os.environ.get("CUDA_VISIBLE_DEVICES")
            os.environ["CUDA_VISIBLE_DEVICES"] = device
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            log.info(
                "holding GPU slot %s (CUDA_VISIBLE_DEVICES=%s)",
                slot_dir / f"gpu{device}.lock",
                device,
            )
            try:
                yield device
            finally:
                if previous is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = previous
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no free GPU slot among {devices} in {slot_dir} after {timeout_s} s"
            )
        time.sleep(poll_s)

"""GPU placement for concurrent jobs, and the numerical settings of a GPU computation.

Placement: one lock-file slot per device a job may use. Snakemake counts a ``gpu`` resource but
never assigns device ids (snakemake issue 281), so every job would land on ``cuda:0``. A GPU job
takes an exclusive ``flock`` on one slot file per device for its lifetime and sets
``CUDA_VISIBLE_DEVICES`` to that device before CUDA initialises. The kernel releases a ``flock``
when its process dies, so a crashed or killed job frees its slot. The same holds wherever the
job runs:

* locally: slots in ``.snakemake/gpu-slots`` of the working directory;
* inside a SLURM allocation: slots in a node-local folder of that allocation and step
  (:func:`slot_dir`), shared out one GPU each to the jobs Snakemake starts there, never waiting
  on other allocations (which see their own GPUs under the same ids).

The devices are listed without initialising CUDA (:func:`visible_devices`): from the
environment (``CUDA_VISIBLE_DEVICES``, ``SLURM_STEP_GPUS``, ``SLURM_JOB_GPUS``), else
``nvidia-smi -L``, else ``/proc/driver/nvidia/gpus``. torch's ``cuda.device_count()`` is not
asked while a device can still be chosen: without NVML it calls ``cudaGetDeviceCount``, which
initialises CUDA with every GPU visible, after which ``CUDA_VISIBLE_DEVICES`` is ignored by the
process. SLURM's variables hold physical ids; under device cgroups the job addresses its GPUs as
``0..n-1``, so ids the job cannot see (none among the ordinals ``nvidia-smi -L`` lists) are mapped
onto those ordinals when the counts match, else refused naming the variable
(:func:`slurm_devices`).

No silent sharing: when nothing lists a GPU but torch reports some, every GPU job takes the one
slot ``gpu-unlisted`` (:data:`UNLISTED`), never two on ``cuda:0`` unawares. No silent CPU: a job
that asked for a GPU and finds none says so (:func:`gpu_slot`; ``select_device`` refuses
``device: cuda``). Slot folders and locks are plain, this user's, one name each.

Numerics: :func:`numerics` sets, for a block, whether float32 matmuls and cuDNN convolutions may
use TF32 (``precision``: ``fp32`` full IEEE float32, the default; ``tf32``; ``bf16``, bfloat16
autocast, see :func:`autocast`) and, on CUDA, deterministic algorithms; it yields what was set
(:func:`numerics_record`), which the stores record. torch's own default lets cuDNN convolutions
use TF32, so without this block a GPU convolution is not full float32.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from repdiag.core.runtime import check_private_file, check_private_folder, closed_on_error

log = logging.getLogger(__name__)

SLOT_DIR_ENV = "REPDIAG_GPU_SLOT_DIR"
DEVICES_ENV = "REPDIAG_GPU_DEVICES"  # comma-separated ids; overrides detection (tests, clusters)
# Where the job's GPUs are named, in order of precedence. SLURM sets CUDA_VISIBLE_DEVICES for
# its GPU jobs; its own variables serve when a site's prolog does not.
DEVICE_VARIABLES = (DEVICES_ENV, "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver knows
UNLISTED = "unlisted"  # the one slot of GPUs that torch sees but nothing lists


def _id_list(value: str) -> list[str]:
    return [d.strip() for d in value.split(",") if d.strip() and d.strip() != "-1"]


def _nvidia_smi_devices() -> list[str] | None:
    """CUDA ordinals ``0..n-1`` of the GPUs ``nvidia-smi -L`` lists; None when it cannot say
    (absent, or NVML failing: it prints an error and exits non-zero)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    count = sum(1 for line in done.stdout.splitlines() if re.match(r"GPU \d+:", line))
    return [str(i) for i in range(count)]


def _proc_devices() -> list[str]:
    """CUDA ordinals ``0..n-1`` of the GPUs in /proc/driver/nvidia/gpus (no NVML needed)."""
    return [str(i) for i in range(len(list(NVIDIA_PROC.iterdir())))] if NVIDIA_PROC.is_dir() else []


def _listed_devices() -> list[str] | None:
    """Ordinals of the GPUs ``nvidia-smi -L`` (else /proc/driver/nvidia/gpus) lists; None when
    neither lists any."""
    listed = _nvidia_smi_devices()
    if listed is None:
        listed = _proc_devices()
    return listed or None


def slurm_devices(var: str, value: str) -> list[str]:
    """The ids of SLURM's ``var`` (``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``: physical ids) as this
    job addresses them.

    Kept when nothing lists the job's GPUs, when an id is not a number (a UUID), or when every id
    is among the listed ordinals. Otherwise the job runs under device cgroups that renumber its
    GPUs ``0..n-1``: with as many listed as named, the listed ordinals are used; else a
    :class:`~repdiag.core.errors.ConfigError` names the variable and what to set.
    """
    ids = _id_list(value)
    if not ids or not all(i.isdigit() for i in ids):
        return ids
    listed = _listed_devices()
    if listed is None or set(ids) <= set(listed):
        return ids
    if len(listed) == len(ids):
        log.info(
            "%s=%s names GPUs this job cannot address; it sees ordinals %s (device cgroups): "
            "using those",
            var, value, ",".join(listed),
        )  # fmt: skip
        return listed
    from repdiag.core.errors import ConfigError

    raise ConfigError(
        f"{var}={value} names {len(ids)} GPU(s) by physical id, but this job sees "
        f"{len(listed)} (ordinals {','.join(listed)}): the ids cannot be mapped. Set "
        f"CUDA_VISIBLE_DEVICES (or {DEVICES_ENV}) to the ordinals this job may use, e.g. "
        f"{DEVICES_ENV}={','.join(listed[: len(ids)])}"
    )


def visible_devices() -> list[str]:
    """Device ids this job may use, found without initialising CUDA.

    The first of ``$REPDIAG_GPU_DEVICES``, ``$CUDA_VISIBLE_DEVICES``, ``$SLURM_STEP_GPUS`` and
    ``$SLURM_JOB_GPUS`` that is set (comma-separated; ``-1`` and empty entries dropped; SLURM's
    ids through :func:`slurm_devices`), else the ordinals of the GPUs ``nvidia-smi -L`` lists,
    else of those in /proc/driver/nvidia/gpus.
    """
    for var in DEVICE_VARIABLES:
        value = os.environ.get(var)
        if value is not None:
            return slurm_devices(var, value) if var.startswith("SLURM_") else _id_list(value)
    listed = _nvidia_smi_devices()
    return listed if listed is not None else _proc_devices()


def _named_in_environment() -> bool:
    """Whether a device variable is set (even empty: no GPU for this job, by choice)."""
    return any(os.environ.get(var) is not None for var in DEVICE_VARIABLES)


def unlisted_gpus() -> int:
    """GPUs torch reports when nothing lists them (no device variable, ``nvidia-smi`` or /proc
    entry): asked of torch only then, since nothing could be chosen anyway; 0 when torch is
    absent or sees none."""
    if _named_in_environment():
        return 0
    import torch

    return int(torch.cuda.device_count())


def count_visible_gpus() -> int:
    """Number of usable GPUs, without importing torch (the Snakefile calls this on every parse)."""
    return len(visible_devices())


def slot_dir() -> Path:
    """Folder of the slot lock files: ``$REPDIAG_GPU_SLOT_DIR``; inside a SLURM allocation a
    node-local folder of that allocation and step (``$TMPDIR`` or the system's temporary
    folder; user, job, step and host in its name); else ``.snakemake/gpu-slots``."""
    if os.environ.get(SLOT_DIR_ENV):
        return Path(os.environ[SLOT_DIR_ENV])
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return Path(".snakemake/gpu-slots")
    step = os.environ.get("SLURM_STEP_ID", "")
    name = f"repdiag-gpu-slots-{os.getuid()}-slurm-{job}-{step}-{socket.gethostname()}"
    return Path(os.environ.get("TMPDIR") or tempfile.gettempdir()) / re.sub(
        r"[^A-Za-z0-9._-]", "_", name
    )


def _open_lock(path: Path) -> IO[str]:
    """Open (creating) a slot lock file without following a symbolic link."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as error:
        if error.errno == errno.ELOOP or path.is_symlink():
            raise OSError(
                error.errno,
                f"GPU slot lock {path} is a symbolic link; refusing to follow it. Remove it, or "
                f"set {SLOT_DIR_ENV} to a folder only you can write",
            ) from error
        raise
    with closed_on_error(fd):
        check_private_file(fd, path, "GPU slot lock")
    return os.fdopen(fd, "r+")


def _lock_name(device: str) -> str:
    if device == UNLISTED:
        return "gpu-unlisted.lock"
    return f"gpu{re.sub(r'[^A-Za-z0-9._-]', '_', device)}.lock"


def try_slot(folder: Path, devices: list[str]) -> tuple[str, IO[str]] | None:
    """Lock the first free device's slot file in ``folder``: (device, open locked handle), or
    None when every device is held."""
    for device in devices:
        handle = _open_lock(folder / _lock_name(device))
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        return device, handle
    return None


@contextlib.contextmanager
def _no_gpu() -> Iterator[None]:
    """Hide every GPU for the block (``CUDA_VISIBLE_DEVICES`` empty), then restore it."""
    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield None
    finally:
        if previous is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = previous


def _take_slot(
    folder: Path, devices: list[str], poll_s: float, timeout_s: float
) -> tuple[str, IO[str]]:
    """Wait for a free slot among ``devices`` in ``folder`` (created private; an existing one
    must be a plain folder of this user's)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_private_folder(folder, "GPU slot folder", f" or set {SLOT_DIR_ENV} to another")
    deadline = time.monotonic() + timeout_s
    while (taken := try_slot(folder, devices)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no free GPU slot among {devices} in {folder} after {timeout_s} s")
        time.sleep(poll_s)
    return taken


def _devices_or_unlisted(devices: list[str] | None, device: str) -> list[str]:
    """The devices to take a slot among: ``devices`` (default :func:`visible_devices`); none
    listed but torch sees some: the one slot :data:`UNLISTED`; none at all: [] (logged)."""
    if devices is None:
        devices = visible_devices()
        if not devices and (count := unlisted_gpus()):
            log.warning(
                "torch sees %d GPU(s) but nothing lists them (no CUDA_VISIBLE_DEVICES, "
                "SLURM_STEP_GPUS, SLURM_JOB_GPUS, nvidia-smi or /proc/driver/nvidia/gpus): one "
                "GPU job at a time (slot gpu-unlisted), on cuda:0; set %s or "
                "CUDA_VISIBLE_DEVICES to the devices' ids to run one job per GPU",
                count, DEVICES_ENV,
            )  # fmt: skip
            return [UNLISTED]
    if not devices:
        log.warning(
            "this job asked for a GPU (device: %s) but none is visible (CUDA_VISIBLE_DEVICES=%s): "
            "no GPU slot taken; the device setting decides whether it runs on the CPU",
            device, os.environ.get("CUDA_VISIBLE_DEVICES"),
        )  # fmt: skip
    return devices


@contextlib.contextmanager
def gpu_slot(
    devices: list[str] | None = None,
    poll_s: float = 0.5,
    timeout_s: float = 86400.0,
    *,
    device: str = "auto",
) -> Iterator[str | None]:
    """Hold one free device for the block and expose only it through ``CUDA_VISIBLE_DEVICES``.

    ``devices``: default :func:`visible_devices`; slots in :func:`slot_dir`. Yields the device
    id; :data:`UNLISTED` when torch sees GPUs that nothing lists (one such job at a time,
    ``CUDA_VISIBLE_DEVICES`` left alone); ``None`` when no GPU is visible (logged as a warning:
    :func:`~repdiag.core.runtime.select_device` then runs ``auto`` on the CPU and refuses
    ``cuda``). Blocks, polling every ``poll_s``, while every device is held by other jobs;
    ``timeout_s`` is a hang guard. ``device``: the job's configured device; ``cpu`` takes no
    slot and hides every GPU for the block (a CPU job neither holds a GPU another job waits for
    nor initialises CUDA on one).
    """
    if str(device) == "cpu":
        with _no_gpu():
            yield None
        return
    devices = _devices_or_unlisted(devices, str(device))
    if not devices:
        yield None
        return
    folder = slot_dir()
    taken, handle = _take_slot(folder, devices, poll_s, timeout_s)
    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    if taken != UNLISTED:
        os.environ["CUDA_VISIBLE_DEVICES"] = taken
    log.info(
        "holding GPU slot of device %s in %s (CUDA_VISIBLE_DEVICES=%s)",
        taken, folder, os.environ.get("CUDA_VISIBLE_DEVICES"),
    )  # fmt: skip
    try:
        yield taken
    finally:
        if previous is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = previous
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
        log.info("released GPU slot of device %s", taken)


def small_job_device(config: dict[str, Any]) -> str:
    """The device of the small jobs (config ``small_jobs_device``, default ``cpu``)."""
    return str(config.get("small_jobs_device") or "cpu")


def small_job_gpus(config: dict[str, Any]) -> int:
    """The ``gpu`` resource of a small job: 0 when it runs on the CPU, else 1 (a slot)."""
    return 0 if small_job_device(config) == "cpu" else 1


# ----------------------------------------------------------------------------------------------
# Numerics: TF32, bfloat16 autocast, deterministic algorithms
# ----------------------------------------------------------------------------------------------

PRECISIONS = ("fp32", "tf32", "bf16")
CUBLAS_WORKSPACE = ":4096:8"  # cuBLAS's setting for deterministic results (CUDA docs)


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        from repdiag.core.errors import ConfigError

        raise ConfigError(f"unknown precision {precision!r}; choose one of {list(PRECISIONS)}")


def _device_type(device: Any) -> str:
    return str(getattr(device, "type", device) or "cpu").split(":")[0]


def effective_precision(
    precision: str, device: Any, capability: tuple[int, int] | None = None
) -> str:
    """What ``precision`` computes in on ``device``: TF32 exists only on CUDA devices of compute
    capability 8.0 (Ampere) or later; elsewhere (CPU, older GPUs) ``tf32`` is full ``fp32``.

    ``capability``: the device's (major, minor); default: asked of torch for a CUDA device
    (none visible: ``fp32``, nothing runs there).
    """
    _check_precision(precision)
    if precision != "tf32" or _device_type(device) != "cuda":
        return "fp32" if precision == "tf32" else precision
    if capability is None:
        import torch

        if not torch.cuda.is_available():
            return "fp32"
        capability = tuple(torch.cuda.get_device_capability(device))
    return "tf32" if tuple(capability) >= (8, 0) else "fp32"


def _tf32_switches() -> list[tuple[str, Any, str]]:
    """(name, object, attribute) of torch's TF32 switches for CUDA matmuls and cuDNN, parents
    first. The ``fp32_precision`` API where torch has it (>= 2.9; torch refuses a mix of it and the
    legacy ``allow_tf32`` flags), else the legacy flags. oneDNN's (CPU) setting is left alone.
    """
    import torch

    backends = torch.backends
    if hasattr(backends.cuda.matmul, "fp32_precision"):
        return [
            ("cuda.matmul.fp32_precision", backends.cuda.matmul, "fp32_precision"),
            ("cudnn.fp32_precision", backends.cudnn, "fp32_precision"),
            ("cudnn.conv.fp32_precision", backends.cudnn.conv, "fp32_precision"),
            ("cudnn.rnn.fp32_precision", backends.cudnn.rnn, "fp32_precision"),
        ]
    return [
        ("cuda.matmul.allow_tf32", backends.cuda.matmul, "allow_tf32"),
        ("cudnn.allow_tf32", backends.cudnn, "allow_tf32"),
    ]


def _tf32_value(attribute: str, tf32: bool) -> Any:
    return tf32 if attribute == "allow_tf32" else ("tf32" if tf32 else "ieee")


def numerics_record() -> dict[str, Any]:
    """torch's current numerical switches, as recorded in stores (JSON-ready).

    ``tf32``: {switch: value} for CUDA matmuls and cuDNN (``ieee`` or ``False``: full float32);
    ``deterministic_algorithms``, ``deterministic_warn_only``, ``cudnn_deterministic``,
    ``cudnn_benchmark``, ``fill_uninitialized_memory`` and ``CUBLAS_WORKSPACE_CONFIG``.
    """
    import torch

    tf32 = {name: getattr(obj, attribute) for name, obj, attribute in _tf32_switches()}
    fill = getattr(getattr(torch.utils, "deterministic", None), "fill_uninitialized_memory", None)
    return {
        "tf32": tf32,
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "deterministic_warn_only": bool(torch.is_deterministic_algorithms_warn_only_enabled()),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "fill_uninitialized_memory": fill,
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


@contextlib.contextmanager
def numerics(
    precision: str = "fp32",
    device: Any = "cpu",
    deterministic: bool = True,
    capability: tuple[int, int] | None = None,
) -> Iterator[dict[str, Any]]:
    """Set torch's TF32 switches for ``precision`` (TF32 only for ``tf32``; ``fp32`` and ``bf16``
    keep float32 ops in full IEEE float32) and, on a CUDA ``device`` with ``deterministic``,
    deterministic algorithms (``torch.use_deterministic_algorithms(True, warn_only=True)``,
    cuDNN deterministic without benchmarking, ``CUBLAS_WORKSPACE_CONFIG`` when unset); restore
    every switch after the block.

    Yields ``{"precision", "precision_effective", "device", **numerics_record()}``
    (``capability``: see :func:`effective_precision`). CPU kernels
    are deterministic at a fixed thread count already, so on CPU only the (inert) TF32 switches
    are set and CPU results do not change.
    """
    import torch

    _check_precision(precision)
    device_type = _device_type(device)
    switches = _tf32_switches()
    saved = [(obj, attribute, getattr(obj, attribute)) for _, obj, attribute in switches]
    saved_workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    saved_deterministic = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    try:
        for _, obj, attribute in switches:
            if attribute == "fp32_precision" and obj is torch.backends.cudnn:
                continue  # the parent of conv and rnn: set through them
            setattr(obj, attribute, _tf32_value(attribute, precision == "tf32"))
        if deterministic and device_type == "cuda":
            # read when cuBLAS creates its handle: effective if CUDA has not run a matmul yet
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
        yield {
            "precision": precision,
            "precision_effective": effective_precision(precision, device, capability),
            "device": device_type,
            **numerics_record(),
        }
    finally:
        for obj, attribute, value in saved:  # parents first, then their children
            setattr(obj, attribute, value)
        if saved_workspace is None:  # cuBLAS handles made in the block keep their workspace
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        enabled, warn_only, cudnn_deterministic, benchmark = saved_deterministic
        now = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        if now != (enabled, warn_only):  # the setter imports torch._inductor: 2-3 s of CPU
            torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.backends.cudnn.deterministic = cudnn_deterministic
        torch.backends.cudnn.benchmark = benchmark


def autocast(precision: str, device: Any) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on ``device`` for ``bf16`` (matmuls and convolutions in bfloat16, float32
    accumulation, reductions and norms in float32); a no-op for ``fp32`` and ``tf32``."""
    _check_precision(precision)
    if precision != "bf16":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(_device_type(device), dtype=torch.bfloat16)

"""Run-time plumbing shared by workflow scripts and the CLI: logging, threads, device choice."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

log = logging.getLogger("repdiag")

# Seconds between progress lines of long loops; lower it to watch a job closely.
PROGRESS_ENV = "REPDIAG_PROGRESS_EVERY_S"


@contextlib.contextmanager
def script_logging(
    log_path: str | os.PathLike[str] | None, threads: int | None = None
) -> Iterator[logging.Logger]:
    """Send logging and stderr to ``log_path`` for the duration of a workflow script.

    Also caps torch's intra-op threads and the BLAS threads of numpy, scipy and scikit-learn at
    the job's ``threads`` so parallel jobs do not oversubscribe the cores Snakemake gave them
    (numpy is imported before this runs, so OpenBLAS already started one thread per core: on
    small matrices they only contend, and an lbfgs probe fit runs 18x slower with two of them on
    two cores). An exception is logged with its traceback before it propagates (Snakemake then
    marks the job failed and removes its outputs).
    """
    with contextlib.ExitStack() as stack:
        if threads:
            from threadpoolctl import threadpool_limits

            # torch reads OMP_NUM_THREADS when it is first imported; analysis jobs never import it.
            os.environ["OMP_NUM_THREADS"] = str(threads)
            if "torch" in sys.modules:
                sys.modules["torch"].set_num_threads(int(threads))
            stack.enter_context(threadpool_limits(limits=int(threads), user_api="blas"))
        yield from _logging_to(log_path)


def _logging_to(log_path: str | os.PathLike[str] | None) -> Iterator[logging.Logger]:
    if log_path is None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        yield log
        return
    with open_log(log_path) as stream:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        old_stderr = sys.stderr
        sys.stderr = stream
        try:
            yield log
        except BaseException:
            log.exception("job failed")
            raise
        finally:
            sys.stderr = old_stderr
            root.removeHandler(handler)


def exit_job() -> NoReturn:
    """End a workflow job whose outputs are written: run the exit handlers, flush the logs and
    the standard streams, then leave with status 0 without the interpreter's teardown.

    Every adapter in ``workflow_scripts/`` calls it after its ``script_logging`` block (a test
    holds the shape); a job that raised never gets here and fails as before. Tearing down an
    interpreter that imported torch and timm frees their modules one object at a time: 0.5 to
    1 s of CPU per job, 16% of a test-config run's CPU (``benchmarks/startup.py`` measures it).
    What a normal exit does for the job's files is kept: the exit handlers (``atexit``) run, the
    outputs were closed when the writers returned, and ``os._exit`` leaves the kernel's page
    cache as a normal exit does.
    """
    atexit._run_exitfuncs()  # what a normal exit runs first; os._exit alone would skip them
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def progress_interval(default: float = 10.0) -> float:
    """Seconds between progress lines: ``$REPDIAG_PROGRESS_EVERY_S`` when set, else ``default``."""
    value = os.environ.get(PROGRESS_ENV)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        from repdiag.core.errors import ConfigError

        raise ConfigError(f"{PROGRESS_ENV}={value!r} must be a number of seconds >= 0")
    return seconds


class Progress:
    """Log ``done/total`` with rate and ETA at most every ``every_s`` seconds (for long loops).

    ``every_s`` defaults to :func:`progress_interval` (10 s unless the environment says otherwise).
    """

    def __init__(
        self,
        total: int,
        what: str,
        every_s: float | None = None,
        logger: logging.Logger = log,
    ) -> None:
        every_s = progress_interval() if every_s is None else every_s
        self.total, self.what, self.every_s, self.logger = total, what, every_s, logger
        self.start = self.last = time.monotonic()
        self.done = 0

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.every_s or self.done >= self.total:
            self.last = now
            rate = self.done / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            self.logger.info(
                "%s: %d/%d (%.1f/s, eta %.0f s)", self.what, self.done, self.total, rate, eta
            )


def select_device(requested: str = "auto") -> Any:
    """The torch device of a job whose config says ``device: requested``.

    ``auto`` -> the job's CUDA device (``cuda:<current>``, with its index, as tensors report it)
    when CUDA sees one, else the CPU with a warning naming the setting (a job that asked for a
    GPU never runs on the CPU unannounced); ``cpu`` and ``cuda[:i]`` are taken as given, and
    ``cuda`` without a GPU is a :class:`~repdiag.core.errors.ConfigError`.
    """
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if requested == "auto":
        if torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
            log.info("using %s (%s)", device, torch.cuda.get_device_name(device))
            return device
        log.warning(
            "device: auto asked for a GPU but CUDA sees none (CUDA_VISIBLE_DEVICES=%s): running "
            "on the CPU; set device: cpu to run there on purpose",
            visible,
        )
        return torch.device("cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        from repdiag.core.errors import ConfigError

        raise ConfigError(
            f"device: {requested} asks for a GPU but CUDA sees none here "
            f"(CUDA_VISIBLE_DEVICES={visible}); run the job where a GPU is visible (a GPU "
            "slot, docs/running.md), or set device: auto (the CPU, with a warning) or cpu"
        )
    return device


def expose_package(workflow_dir: str | os.PathLike[str]) -> None:
    """Put the workflow directory on PYTHONPATH so jobs in conda envs import this repdiag.

    The conda environments in envs/ hold the dependencies only; the package itself is the one
    beside the Snakefile, so a software-env job and a venv job run the same code.
    """
    root = str(Path(workflow_dir).resolve())
    current = os.environ.get("PYTHONPATH", "")
    if root not in current.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, current) if p)


OUTPUT_FOLDERS = ("results", "logs")


def check_output_folders(root: str | os.PathLike[str]) -> None:
    """Refuse any symbolic link in the output trees, at any depth: jobs never write through one.

    ``results/`` and ``logs/`` (job logs and Snakemake's benchmark files under
    ``logs/benchmarks/``) and everything below them, folders and files alike, must be plain:
    Snakemake writes logs and benchmark files itself, following any link, so a link to a file
    outside the tree would have that file overwritten. Run once per Snakemake invocation, before
    any job (``rules/common.smk``); the walk reads only directory entries (no file is opened).
    """
    from repdiag.core.errors import ConfigError

    root = Path(root).resolve()
    shared = _first_hard_link(root / "logs")
    if shared is not None:
        raise ConfigError(
            f"{shared.relative_to(root)} is a hard link ({os.lstat(shared).st_nlink} names for one "
            "file): Snakemake and the jobs write logs and benchmark files in place, so the file "
            "behind its other names would change too; delete it (a rerun writes it anew)"
        )
    for name in OUTPUT_FOLDERS:
        link = _first_link(root / name)
        if link is not None:
            rel = link.relative_to(root)
            raise ConfigError(
                f"{rel} resolves to {link.resolve()} through a symbolic link; jobs write no "
                f"file through a link (it would overwrite what the link points to): replace "
                f"{rel} by a plain folder or file (or run from a working directory on the disk "
                "you want, snakemake --directory)"
            )


def _first_hard_link(top: Path) -> Path | None:
    """The first regular file at or under ``top`` with more than one name (``st_nlink`` > 1).

    Checked where files are written in place (logs, benchmark files, locks); a store or table
    is replaced by a rename, which leaves another name's file as it was."""
    for folder, _, files in os.walk(top, followlinks=False):
        for name in sorted(files):
            info = os.lstat(Path(folder) / name)
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                return Path(folder) / name
    return None


def _first_link(top: Path) -> Path | None:
    """The first symbolic link at or under ``top`` (not followed), or None."""
    if top.is_symlink():
        return top
    for folder, dirs, files in os.walk(top, followlinks=False):
        for name in sorted((*dirs, *files)):
            if (Path(folder) / name).is_symlink():
                return Path(folder) / name
    return None


def open_log(path: str | os.PathLike[str]) -> Any:
    """``path`` opened for appending text, line-buffered, never through a symbolic link:
    ``O_NOFOLLOW`` refuses a link as the file itself; for a relative path (Snakemake's), a link
    as any folder between the working directory and the file is refused too."""
    from repdiag.core.errors import ConfigError

    path = Path(path)
    if not path.is_absolute():
        for depth in range(1, len(path.parts)):
            folder = Path(*path.parts[:depth])
            if folder.is_symlink():
                raise ConfigError(
                    f"log file {path}: {folder} is a symbolic link; a log is never written "
                    "through a link: replace it by a plain folder"
                )
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        raise ConfigError(
            f"log file {path} cannot be opened ({err}); a log is never written through a "
            "symbolic link: replace it by a plain file"
        ) from err
    with closed_on_error(fd):
        check_private_file(fd, path, "log file")
    return os.fdopen(fd, "a", buffering=1)


@contextlib.contextmanager
def closed_on_error(fd: int) -> Iterator[None]:
    """Close ``fd`` when the block raises (a check refused the file it opened)."""
    try:
        yield
    except BaseException:
        os.close(fd)
        raise


def check_private_folder(folder: str | os.PathLike[str], what: str, hint: str = "") -> None:
    """Refuse a folder files are written in that is a symbolic link or another user's."""
    from repdiag.core.errors import ConfigError

    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{what} {folder} is a symbolic link or not a folder; remove it{hint}")
    if info.st_uid != os.getuid():
        raise ConfigError(f"{what} {folder} belongs to another user; remove it{hint}")


def check_private_file(fd: int, path: str | os.PathLike[str], what: str) -> None:
    """Refuse an open file written in place that is not this run's alone: not a regular file,
    another name for it (a hard link), or another user's (ConfigError naming ``what``)."""
    from repdiag.core.errors import ConfigError

    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{what} {path} is not a regular file; remove it")
    if info.st_nlink > 1:
        raise ConfigError(
            f"{what} {path} is a hard link ({info.st_nlink} names for one file): writing it "
            "would change the file behind its other names; delete it"
        )
    if info.st_uid != os.getuid():
        raise ConfigError(f"{what} {path} belongs to another user (uid {info.st_uid}); delete it")

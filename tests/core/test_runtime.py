"""Run-time plumbing: progress logging, and the job set-up of script_logging (log file, threads)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repdiag.core.errors import ConfigError
from repdiag.core.runtime import (
    PROGRESS_ENV,
    Progress,
    check_output_folders,
    exit_job,
    progress_interval,
    script_logging,
)


def test_progress_interval_defaults_to_ten_seconds(monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    assert progress_interval() == 10.0


def test_progress_interval_zero_logs_every_update(monkeypatch, caplog):
    monkeypatch.setenv(PROGRESS_ENV, "0")
    progress = Progress(3, "steps", logger=logging.getLogger("repdiag.test"))
    with caplog.at_level(logging.INFO, logger="repdiag.test"):
        for _ in range(3):
            progress.update()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "steps: 1/3",
        "steps: 2/3",
        "steps: 3/3",
    ]


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_bad_progress_interval_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(PROGRESS_ENV, value)
    with pytest.raises(ConfigError, match=PROGRESS_ENV):
        progress_interval()


def blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


def test_script_logging_caps_blas_threads_for_the_job_and_restores_them(tmp_path):
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()
        assert before and max(before) == 2
        with script_logging(tmp_path / "job.log", threads=1):
            assert blas_threads() == [1] * len(before)
        assert blas_threads() == before


def test_script_logging_logs_the_failure_and_reraises(tmp_path):
    log_path = tmp_path / "job.log"
    with pytest.raises(ZeroDivisionError), script_logging(log_path, threads=1):
        raise ZeroDivisionError("the job's own error")
    assert "job failed" in log_path.read_text()
    assert "ZeroDivisionError" in log_path.read_text()


def test_output_folders_leading_outside_the_tree_are_refused(tmp_path) -> None:
    root, outside = tmp_path / "wf", tmp_path / "elsewhere"
    (root / "results" / "tables").mkdir(parents=True)
    outside.mkdir()
    check_output_folders(root)  # plain folders, and none at all for logs/
    (root / "results" / "datasets").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfigError, match=r"results/datasets resolves to .*elsewhere through a"):
        check_output_folders(root)
    (root / "results" / "datasets").unlink()
    inside = root / "store"
    inside.mkdir()
    (root / "results" / "datasets").symlink_to(inside, target_is_directory=True)
    with pytest.raises(ConfigError, match=r"results/datasets resolves to .*store through a"):
        check_output_folders(root)  # a link is refused wherever it leads
    (root / "results" / "datasets").unlink()
    (root / "logs").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfigError, match="logs resolves to"):
        check_output_folders(root)


def test_a_file_link_at_any_depth_of_the_output_trees_is_refused(tmp_path) -> None:
    """A benchmark file deep under logs/ linked to a file outside: Snakemake would overwrite it."""
    root, victim = tmp_path / "wf", tmp_path / "victim.tsv"
    victim.write_text("precious\n")
    deep = root / "logs" / "benchmarks" / "render_binding"
    deep.mkdir(parents=True)
    (root / "results" / "a" / "b" / "c" / "d").mkdir(parents=True)
    check_output_folders(root)
    (deep / "binding.tsv").symlink_to(victim)
    with pytest.raises(
        ConfigError, match=r"logs/benchmarks/render_binding/binding\.tsv resolves to .*victim"
    ):
        check_output_folders(root)
    (deep / "binding.tsv").unlink()
    (root / "results" / "a" / "b" / "c" / "d" / "x.json").symlink_to(victim)
    with pytest.raises(ConfigError, match=r"results/a/b/c/d/x\.json resolves to"):
        check_output_folders(root)
    assert victim.read_text() == "precious\n"


def test_a_job_log_is_never_written_through_a_link(tmp_path, monkeypatch) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    monkeypatch.chdir(tmp_path)
    Path("logs").mkdir()
    Path("logs/job.log").symlink_to(victim)
    with pytest.raises(ConfigError, match=r"log file logs/job\.log cannot be opened"):
        with script_logging("logs/job.log"):
            pass
    Path("logs/sub").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ConfigError, match=r"logs/sub is a symbolic link"):
        with script_logging("logs/sub/job.log"):
            pass
    assert victim.read_text() == "precious\n" and not (tmp_path / "job.log").exists()
    os.link(victim, "logs/hard.log")  # a hard link: another name for the victim itself
    with pytest.raises(ConfigError, match=r"log file logs/hard\.log is a hard link"):
        with script_logging("logs/hard.log"):
            pass
    assert victim.read_text() == "precious\n"


def test_a_hard_link_among_the_logs_stops_the_run_and_one_among_the_results_does_not(
    tmp_path,
) -> None:
    """Logs and benchmark files are written in place (by Snakemake too): a hard link there
    would change its other name's file. Results are replaced by a rename: harmless there."""
    victim = tmp_path / "victim.tsv"
    victim.write_text("precious\n")
    root = tmp_path / "work"
    (root / "logs" / "benchmarks").mkdir(parents=True)
    (root / "results").mkdir()
    os.link(victim, root / "results" / "table.csv")
    check_output_folders(root)
    os.link(victim, root / "logs" / "benchmarks" / "job.tsv")
    with pytest.raises(ConfigError, match=r"logs/benchmarks/job\.tsv is a hard link \(3 names"):
        check_output_folders(root)


# ------------------------------------------------------------------------- select_device


def test_auto_without_a_gpu_warns_naming_the_setting_and_cuda_refuses(monkeypatch, caplog):
    """A job that asked for a GPU and finds none: ``auto`` runs on the CPU with a warning (the
    old INFO line was easy to miss: the level is checked), ``cuda`` stops with a clear error."""
    import torch

    from repdiag.core.runtime import select_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    with caplog.at_level(logging.INFO, logger="repdiag"):
        assert select_device("auto") == torch.device("cpu")
    (record,) = [r for r in caplog.records if "device: auto" in r.getMessage()]
    assert record.levelno == logging.WARNING and "CUDA_VISIBLE_DEVICES=2" in record.getMessage()
    with pytest.raises(ConfigError, match=r"device: cuda asks for a GPU but CUDA sees none"):
        select_device("cuda")
    assert select_device("cpu") == torch.device("cpu")


def test_auto_with_a_gpu_gives_the_indexed_device_tensors_report():
    """Under the simulated CUDA: ``auto`` is ``cuda:0`` (a bare ``cuda`` would not compare equal
    to a tensor's device, and asks the driver for its index)."""
    import torch

    from repdiag.core.runtime import select_device
    from tests.simulated_cuda import simulated_cuda

    with simulated_cuda() as cuda:
        device = select_device("auto")
        assert device == cuda and torch.zeros(2, device=device).device == device


JOB_THAT_EXITS = """
import atexit, logging, sys
from repdiag.core.runtime import exit_job

class Teardown:
    def __del__(self):  # runs when the interpreter frees its modules, never after os._exit
        open(sys.argv[1] + "/teardown", "w").write("ran")

kept = Teardown()
atexit.register(lambda: open(sys.argv[1] + "/atexit", "w").write("ran"))
handler = logging.StreamHandler(open(sys.argv[1] + "/job.log", "w", buffering=65536))
logging.getLogger().addHandler(handler)
logging.getLogger().warning("outputs written")
sys.stdout.write("no newline, block-buffered")
exit_job()
raise SystemExit(3)  # never reached
"""


def test_exit_job_keeps_what_a_normal_exit_writes_and_skips_the_teardown(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run(
        [sys.executable, "-c", JOB_THAT_EXITS, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "no newline, block-buffered"  # flushed though block-buffered (a pipe)
    assert (tmp_path / "job.log").read_text() == "outputs written\n"  # its 64 KiB buffer flushed
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "teardown").exists()  # the interpreter's teardown was skipped


def test_exit_job_runs_the_exit_handlers_before_leaving_with_status_0(monkeypatch):
    """In order: the exit handlers, then ``os._exit(0)`` (stand-ins record both; the real call
    would end pytest)."""
    calls = []
    monkeypatch.setattr(os, "_exit", calls.append)
    monkeypatch.setattr("atexit._run_exitfuncs", lambda: calls.append("atexit"))
    exit_job()
    assert calls == ["atexit", 0]

"""tests/slurm/local_slurm.py without starting daemons: install decisions, generated config."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.slurm import local_slurm
from tests.slurm.local_slurm import LocalSlurm, SlurmUnavailable, install_packages, parse_jobs

NODE = {
    "NodeName": "n1",
    "CPUs": "2",
    "Boards": "1",
    "SocketsPerBoard": "1",
    "CoresPerSocket": "2",
    "ThreadsPerCore": "1",
    "RealMemory": "7900",
}
PORTS = {"slurmctld": 7001, "slurmd": 7002, "slurmdbd": 7003, "mysql": 7004}


def _no_subprocess(*args, **kwargs):
    raise AssertionError(f"unexpected subprocess call {args}")


def test_nothing_is_installed_when_the_binaries_are_present(monkeypatch) -> None:
    monkeypatch.setattr(local_slurm, "missing_binaries", list)
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    assert install_packages() == 0.0


def test_missing_binaries_without_root_is_a_skip_reason(monkeypatch) -> None:
    monkeypatch.setattr(local_slurm, "missing_binaries", lambda: ["slurmctld"])
    monkeypatch.setattr(local_slurm.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    with pytest.raises(SlurmUnavailable, match="needs root"):
        install_packages()


def test_missing_binaries_without_apt_get_is_a_skip_reason(monkeypatch) -> None:
    monkeypatch.setattr(local_slurm, "missing_binaries", lambda: ["slurmctld"])
    monkeypatch.setattr(local_slurm.os, "geteuid", lambda: 0)
    monkeypatch.setattr(local_slurm.shutil, "which", lambda name, **kw: None)
    with pytest.raises(SlurmUnavailable, match="no apt-get"):
        install_packages()


def test_failed_apt_get_refreshes_lists_once_then_is_a_skip_reason(monkeypatch) -> None:
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd[:2])
        return subprocess.CompletedProcess(cmd, 100, "", "E: Unable to locate package slurm-wlm")

    monkeypatch.setattr(local_slurm, "missing_binaries", lambda: ["slurmctld"])
    monkeypatch.setattr(local_slurm.os, "geteuid", lambda: 0)
    monkeypatch.setattr(local_slurm.shutil, "which", lambda name, **kw: "/usr/bin/apt-get")
    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(SlurmUnavailable, match="Unable to locate package"):
        install_packages()
    assert calls == [["apt-get", "install"], ["apt-get", "update"], ["apt-get", "install"]]


@pytest.mark.parametrize("accounting", ["slurmdbd", "squeue"])
def test_slurm_conf_has_one_node_one_partition_and_the_accounting(
    tmp_path: Path, accounting: str
) -> None:
    cluster = LocalSlurm(tmp_path, partition="gpu", accounting=accounting)
    cluster.node, cluster.ports = NODE, PORTS
    (tmp_path / "etc").mkdir()
    cluster._write_slurm_conf()
    conf = dict(line.split("=", 1) for line in cluster.conf.read_text().splitlines() if "=" in line)
    lines = cluster.conf.read_text().splitlines()
    node_lines = [line for line in lines if line.startswith("NodeName=")]
    assert node_lines == [
        "NodeName=n1 NodeAddr=127.0.0.1 CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 "
        "ThreadsPerCore=1 RealMemory=7900 State=UNKNOWN"
    ]
    assert [line for line in lines if line.startswith("PartitionName=")] == [
        "PartitionName=gpu Nodes=n1 Default=YES MaxTime=INFINITE State=UP"
    ]
    assert conf["SlurmctldPort"] == "7001" and conf["SlurmdPort"] == "7002"
    assert conf["AuthInfo"] == f"socket={tmp_path / 'run' / 'munge.sock'}"
    if accounting == "slurmdbd":
        assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"
        assert conf["AccountingStoragePort"] == "7003"
        assert conf["AccountingStoragePass"] == str(tmp_path / "run" / "munge.sock")
    else:
        assert conf["AccountingStorageType"] == "accounting_storage/none"
        assert int(conf["MinJobAge"]) >= 3 * 40  # what the plugin needs to trust squeue


def test_state_round_trips_through_the_state_file(tmp_path: Path) -> None:
    cluster = LocalSlurm(tmp_path, partition="p", node=NODE, ports=PORTS, pids={"slurmd": 12})
    cluster.save()
    loaded = LocalSlurm.load(tmp_path)
    assert (loaded.root, loaded.partition, loaded.node, loaded.ports, loaded.pids) == (
        tmp_path,
        "p",
        NODE,
        PORTS,
        {"slurmd": 12},
    )


def test_parse_jobs_reads_sacct_and_squeue_rows() -> None:
    text = "12|COMPLETED|main|01:00:00|2|rule_a_wildcards_x\n13|CANCELLED by 0|main|30:00|1|\nbad\n"
    rows = parse_jobs(text)
    assert [row["id"] for row in rows] == ["12", "13"]
    assert rows[0] == {
        "id": "12",
        "state": "COMPLETED",
        "partition": "main",
        "timelimit": "01:00:00",
        "cpus": "2",
        "comment": "rule_a_wildcards_x",
    }
    assert rows[1]["state"] == "CANCELLED by 0" and rows[1]["comment"] == ""


def test_the_status_check_interval_is_capped(monkeypatch) -> None:
    """The SLURM test's snakemake caps the plugin's growing status-check interval: the plugin
    still sets it where the cap applies (else the test silently waits minutes again)."""
    import inspect

    import snakemake_executor_plugin_slurm
    from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

    from tests.slurm.capped_status_checks import cap_status_check_interval

    source = inspect.getsource(snakemake_executor_plugin_slurm.Executor.check_active_jobs)
    assert "self.next_seconds_between_status_checks = " in source
    original = RemoteExecutor.next_seconds_between_status_checks
    monkeypatch.setattr(RemoteExecutor, "next_seconds_between_status_checks", original)
    assert cap_status_check_interval(2)
    executor = SimpleNamespace(_next_seconds_between_status_checks=None)
    for asked, used in ((1, 1), (11, 2), (180, 2)):
        RemoteExecutor.next_seconds_between_status_checks.fset(executor, asked)
        assert RemoteExecutor.next_seconds_between_status_checks.fget(executor) == used

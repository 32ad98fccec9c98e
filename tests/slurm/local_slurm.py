"""A real single-node SLURM cluster on this machine, for the SLURM profile test.

Debian's packages (``slurm-wlm``, ``munge``, ``slurmdbd``, ``mariadb-server``) are installed with
apt-get when missing (idempotent: nothing is installed when the binaries are present). Every
daemon runs as root from a private state directory with its own ports, config files, sockets
and logs, so nothing under /etc is used and a second cluster (another test session) does not
collide with this one:

    munged -> mariadbd -> slurmdbd -> (sacctmgr add cluster) -> slurmctld -> slurmd

``slurm.conf`` has one node, this machine as ``slurmd -C`` reports it, and one partition.
Accounting goes through slurmdbd over the private MariaDB, as on real clusters, so ``sacct``
(the executor plugin's status query) works. When slurmdbd cannot be brought up the cluster
falls back to no accounting with a long ``MinJobAge`` (``accounting`` = ``"squeue"``): the
plugin is then told ``--slurm-status-command squeue``.

Command line, for trying the profile by hand:

    python -m tests.slurm.local_slurm start /tmp/slurm-demo   # prints `export SLURM_CONF=...`
    python -m tests.slurm.local_slurm stop /tmp/slurm-demo
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

APT_PACKAGES = ("slurm-wlm", "munge", "slurmdbd", "mariadb-server")
REQUIRED_BINARIES = (
    "munged",
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "mariadbd",
    "mariadb-install-db",
    "mariadb",
    "sbatch",
    "srun",
    "sacct",
    "sacctmgr",
    "squeue",
    "scancel",
    "sinfo",
)
SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")
CLUSTER_NAME = "repdiag"
STATE_FILE = "cluster.json"
# Daemons in start order; stopped in reverse.
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")


class SlurmUnavailable(RuntimeError):
    """SLURM cannot be installed here (not root, no apt-get, packages not installable)."""


class SlurmStartError(RuntimeError):
    """SLURM is installed but a daemon did not come up; the message carries its log."""


def _path_with_sbin() -> str:
    parts = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(parts + [d for d in SBIN_DIRS if d not in parts])


def _which(name: str) -> str | None:
    return shutil.which(name, path=_path_with_sbin())


def missing_binaries() -> list[str]:
    return [name for name in REQUIRED_BINARIES if _which(name) is None]


def install_packages(timeout_s: float = 900.0) -> float:
    """Install the SLURM packages with apt-get when any binary is missing; returns seconds spent.

    Raises SlurmUnavailable (the caller skips) when this is not possible here.
    """
    if not missing_binaries():
        return 0.0
    if os.geteuid() != 0:
        raise SlurmUnavailable(
            f"SLURM binaries {missing_binaries()} are missing and installing "
            f"{' '.join(APT_PACKAGES)} needs root"
        )
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable(
            f"SLURM binaries {missing_binaries()} are missing and there is no apt-get to "
            f"install {' '.join(APT_PACKAGES)}"
        )
    start = time.monotonic()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *APT_PACKAGES]
    proc = subprocess.run(install, capture_output=True, text=True, env=env, timeout=timeout_s)
    if proc.returncode != 0:  # stale or missing package lists: refresh once and retry
        subprocess.run(
            ["apt-get", "update", "-q"], capture_output=True, text=True, env=env, timeout=timeout_s
        )
        proc = subprocess.run(install, capture_output=True, text=True, env=env, timeout=timeout_s)
    if proc.returncode != 0 or missing_binaries():
        raise SlurmUnavailable(
            f"apt-get install {' '.join(APT_PACKAGES)} failed (exit {proc.returncode}; still "
            f"missing {missing_binaries()}):\n{(proc.stdout + proc.stderr)[-2000:]}"
        )
    return time.monotonic() - start


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_line(slurmd: str) -> dict[str, str]:
    """``slurmd -C``'s first line (NodeName=... CPUs=... RealMemory=...) as a dict."""
    out = subprocess.run([slurmd, "-C"], capture_output=True, text=True, check=True).stdout
    fields = dict(item.split("=", 1) for item in out.splitlines()[0].split())
    if "NodeName" not in fields or "CPUs" not in fields:
        raise SlurmStartError(f"unexpected `slurmd -C` output: {out!r}")
    return fields


@dataclass
class LocalSlurm:
    """One single-node SLURM cluster rooted at ``root`` (start(), stop(), env())."""

    root: Path
    partition: str = "main"
    accounting: str = "slurmdbd"  # "slurmdbd" (sacct) or "squeue" (fallback, no accounting)
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    node: dict[str, str] = field(default_factory=dict)
    fallback_reason: str = ""
    install_seconds: float = 0.0  # apt-get, 0 when the packages were there
    start_seconds: float = 0.0  # daemons up and the node idle

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._procs: dict[str, subprocess.Popen] = {}  # children of this process, for reaping

    # ---- paths -------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "run" / "munge.sock"

    @property
    def mysql_socket(self) -> Path:
        return self.root / "run" / "mysqld.sock"

    def log(self, daemon: str) -> Path:
        return self.root / "log" / f"{daemon}.log"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    def env(self) -> dict[str, str]:
        """The environment for SLURM clients (sbatch, sacct...) and for snakemake."""
        path = os.pathsep.join([str(self.bin_dir), _path_with_sbin()])
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": path}

    # ---- life cycle --------------------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> LocalSlurm:
        """Start every daemon and wait until the node is idle; stops what it started on error."""
        self.install_seconds = install_packages()
        started = time.monotonic()
        if os.geteuid() != 0:
            raise SlurmUnavailable("slurmd and munged must run as root here; this user is not root")
        for sub in ("bin", "etc", "run", "log", "spool/ctld", "spool/d", "mysql"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self._write_srun_shim()
        self.node = node_line(_which("slurmd"))
        self.ports = {name: free_port() for name in ("slurmctld", "slurmd", "slurmdbd", "mysql")}
        try:
            self._start_munge()
            if self.accounting == "slurmdbd":
                try:
                    self._start_accounting(timeout_s)
                except SlurmStartError as error:
                    # Fallback: squeue-based status with jobs kept in slurmctld for an hour.
                    self.fallback_reason = str(error)[:4000]
                    for daemon in ("slurmdbd", "mariadbd"):
                        self._stop_daemon(daemon)
                    self.accounting = "squeue"
            self._write_slurm_conf()
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._spawn("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf)])
            self._wait_idle(timeout_s)
        except BaseException:
            self.save()
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        self.save()
        return self

    def stop(self, timeout_s: float = 20.0) -> None:
        """Cancel remaining jobs, then stop the daemons in reverse order (SIGTERM, then SIGKILL)."""
        if self.pids.get("slurmctld"):
            with contextlib.suppress(Exception):
                subprocess.run(
                    ["scancel", "--full", "--user", "root"],
                    env=self.env(),
                    capture_output=True,
                    timeout=10,
                )
        for daemon in reversed(DAEMONS):
            self._stop_daemon(daemon, timeout_s)
        self._kill_stray_job_processes()
        self.save()

    def job_processes(self) -> list[int]:
        """Processes of this cluster's jobs: SLURM_JOB_ID and this SLURM_CONF in their environment.

        proctrack/linuxproc (no cgroups in a container) follows parent links only, so a job
        process whose parent died can outlive ``scancel``; stop() ends those too.
        """
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in environ and any(var.startswith(b"SLURM_JOB_ID=") for var in environ):
                found.append(int(entry.name))
        return found

    def _kill_stray_job_processes(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.job_processes()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            if pids:
                time.sleep(2)

    def save(self) -> None:
        state = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
        (self.root / STATE_FILE).write_text(json.dumps(state, indent=1))

    @classmethod
    def load(cls, root: Path) -> LocalSlurm:
        state = json.loads((Path(root) / STATE_FILE).read_text())
        state["root"] = Path(state["root"])
        return cls(**state)

    # ---- queries -----------------------------------------------------------------------
    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> str:
        proc = subprocess.run(
            list(cmd), env=self.env(), capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise SlurmStartError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
        return proc.stdout

    def diagnostics(self) -> str:
        """The tail of every daemon log, for failure messages."""
        parts = []
        for daemon in DAEMONS:
            path = self.log(daemon)
            if path.exists():
                parts.append(f"--- {path}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    # ---- daemons -----------------------------------------------------------------------
    def _spawn(self, daemon: str, cmd: list[str]) -> None:
        out = open(self.root / "log" / f"{daemon}.stdout", "ab")
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env(),
            start_new_session=True,  # not killed with the test's process group; stop() ends it
        )
        out.close()
        self._procs[daemon] = proc
        self.pids[daemon] = proc.pid
        self.save()
        time.sleep(0.2)
        if proc.poll() is not None:
            raise SlurmStartError(
                f"{daemon} exited at once ({proc.returncode}):\n{self._tail(daemon)}"
            )

    def _tail(self, daemon: str) -> str:
        text = ""
        for path in (self.log(daemon), self.root / "log" / f"{daemon}.stdout"):
            if path.exists():
                text += f"--- {path}\n{path.read_text(errors='replace')[-3000:]}\n"
        return text

    def _alive(self, daemon: str) -> bool:
        pid = self.pids.get(daemon)
        if not pid:
            return False
        proc = self._procs.get(daemon)
        if proc is not None and proc.pid == pid:
            return proc.poll() is None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def _stop_daemon(self, daemon: str, timeout_s: float = 20.0) -> None:
        pid = self.pids.pop(daemon, None)
        if not pid:
            return
        self.pids[daemon] = pid
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            if not self._alive(daemon):
                break
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while self._alive(daemon) and time.monotonic() < deadline:
                time.sleep(0.1)
        self.pids.pop(daemon, None)
        self._procs.pop(daemon, None)

    def _wait(self, what: str, daemon: str, ready, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            if not self._alive(daemon):
                raise SlurmStartError(
                    f"{daemon} died while waiting for {what}:\n{self._tail(daemon)}"
                )
            time.sleep(0.25)
        raise SlurmStartError(
            f"timed out after {timeout_s:.0f} s waiting for {what}:\n{self._tail(daemon)}"
        )

    def _write_srun_shim(self) -> None:
        """An ``srun`` first on PATH that restores $SLURM_CONF, then runs the real srun.

        The jobstep executor (snakemake-executor-plugin-slurm-jobstep 0.6) drops every SLURM_*
        variable, SLURM_CONF included, before the ``srun`` that runs each job. Clusters keep
        slurm.conf at /etc/slurm or serve it configless, so only a cluster whose config lives
        elsewhere, like this private one, needs the config path put back.
        """
        shim = self.bin_dir / "srun"
        shim.write_text(
            "#!/bin/sh\n"
            f"SLURM_CONF={shlex.quote(str(self.conf))}\n"
            "export SLURM_CONF\n"
            f'exec {shlex.quote(_which("srun") or "/usr/bin/srun")} "$@"\n'
        )
        shim.chmod(0o755)

    def _start_munge(self) -> None:
        key = self.root / "etc" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o600)
        self._spawn(
            "munged",
            [
                _which("munged"),
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={self.root / 'run' / 'munged.pid'}",
                f"--log-file={self.log('munged')}",
                f"--seed-file={self.root / 'run' / 'munged.seed'}",
            ],
        )
        self._wait("the munge socket", "munged", self.munge_socket.exists, 20)

    def _start_accounting(self, timeout_s: float) -> None:
        """MariaDB (private datadir, TCP on 127.0.0.1) and slurmdbd, then register the cluster."""
        datadir = self.root / "mysql" / "data"
        proc = subprocess.run(
            [
                _which("mariadb-install-db"),
                "--no-defaults",
                f"--datadir={datadir}",
                "--user=root",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            raise SlurmStartError(f"mariadb-install-db failed:\n{proc.stdout}\n{proc.stderr}")
        self._spawn(
            "mariadbd",
            [
                _which("mariadbd"),
                "--no-defaults",
                f"--datadir={datadir}",
                f"--socket={self.mysql_socket}",
                f"--port={self.ports['mysql']}",
                "--bind-address=127.0.0.1",
                f"--pid-file={self.root / 'run' / 'mariadbd.pid'}",
                f"--log-error={self.log('mariadbd')}",
                "--user=root",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=64M",
                "--innodb-log-file-size=16M",
                "--innodb-lock-wait-timeout=900",
            ],
        )
        self._wait("the MariaDB socket", "mariadbd", self.mysql_socket.exists, timeout_s)
        password = secrets.token_hex(12)
        sql = (
            f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
        )
        mariadb = [_which("mariadb"), "--no-defaults", f"--socket={self.mysql_socket}", "-uroot"]
        proc = subprocess.run([*mariadb, "-e", sql], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise SlurmStartError(f"creating the slurm database user failed: {proc.stderr}")
        dbd_conf = self.root / "etc" / "slurmdbd.conf"
        dbd_conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={self.ports['slurmdbd']}",
                    "SlurmUser=root",
                    f"PidFile={self.root / 'run' / 'slurmdbd.pid'}",
                    f"LogFile={self.log('slurmdbd')}",
                    "DebugLevel=info",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.ports['mysql']}",
                    "StorageUser=slurm",
                    f"StoragePass={password}",
                    "StorageLoc=slurm_acct_db",
                    "",
                ]
            )
        )
        os.chmod(dbd_conf, 0o600)
        # slurm.conf is needed by sacctmgr (it names the slurmdbd host and port).
        self._write_slurm_conf()
        # slurmdbd reads slurmdbd.conf beside $SLURM_CONF.
        self._spawn("slurmdbd", [_which("slurmdbd"), "-D"])

        def cluster_added() -> bool:
            proc = subprocess.run(
                ["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME],
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=30,
            )
            return proc.returncode == 0 or "already exists" in proc.stdout + proc.stderr

        self._wait(
            "slurmdbd to accept `sacctmgr add cluster`", "slurmdbd", cluster_added, timeout_s
        )

    def _write_slurm_conf(self) -> None:
        name = self.node["NodeName"]
        hardware = " ".join(
            f"{key}={self.node[key]}"
            for key in (
                "CPUs",
                "Boards",
                "SocketsPerBoard",
                "CoresPerSocket",
                "ThreadsPerCore",
                "RealMemory",
            )
            if key in self.node
        )
        if self.accounting == "slurmdbd":
            accounting = [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={self.ports['slurmdbd']}",
                # For slurmdbd connections the munge socket is taken from here, not AuthInfo.
                f"AccountingStoragePass={self.munge_socket}",
                "JobAcctGatherType=jobacct_gather/linux",
                "JobAcctGatherFrequency=30",
                "AccountingStoreFlags=job_comment",  # sacct shows the plugin's rule_<name> comment
                "MinJobAge=300",
            ]
        else:
            accounting = [
                "AccountingStorageType=accounting_storage/none",
                "JobAcctGatherType=jobacct_gather/none",
                "MinJobAge=3600",  # finished jobs stay visible to squeue for an hour
            ]
        lines = [
            f"ClusterName={CLUSTER_NAME}",
            f"SlurmctldHost={name}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={self.ports['slurmctld']}",
            f"SlurmdPort={self.ports['slurmd']}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.root / 'spool' / 'ctld'}",
            f"SlurmdSpoolDir={self.root / 'spool' / 'd'}",
            f"SlurmctldPidFile={self.root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.log('slurmctld')}",
            f"SlurmdLogFile={self.log('slurmd')}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",  # no cgroup v2 delegation in a container
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "KillWait=5",
            "InactiveLimit=0",
            "SlurmdTimeout=60",
            *accounting,
            f"NodeName={name} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={name} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
        self.conf.write_text("\n".join(lines))

    def _wait_idle(self, timeout_s: float) -> None:
        def idle() -> bool:
            proc = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%T"],
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=30,
            )
            return proc.returncode == 0 and proc.stdout.strip() == "idle"

        self._wait("the node to be idle in sinfo", "slurmd", idle, timeout_s)


JOB_FIELDS = ("id", "state", "partition", "timelimit", "cpus", "comment")


def parse_jobs(text: str) -> list[dict[str, str]]:
    """Rows of ``id|state|partition|timelimit|cpus|comment`` as dicts (sacct and squeue)."""
    rows = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == len(JOB_FIELDS) and parts[0]:
            rows.append(dict(zip(JOB_FIELDS, parts, strict=True)))
    return rows


def live_jobs(cluster: LocalSlurm) -> list[dict[str, str]]:
    """Jobs slurmctld knows (queued, running, and finished less than MinJobAge ago): squeue."""
    out = cluster.run("squeue", "--states=all", "--noheader", "--format=%i|%T|%P|%l|%C|%k")
    return parse_jobs(out)


def job_table(cluster: LocalSlurm) -> list[dict[str, str]]:
    """Every job this cluster ran: from the accounting database (sacct), else from squeue.

    sacct fills ``comment`` for queued and finished jobs only, so poll running ones with
    live_jobs().
    """
    if cluster.accounting != "slurmdbd":
        return live_jobs(cluster)
    out = cluster.run(
        "sacct", "-X", "-a", "--parsable2", "--noheader", "--starttime=now-7days",
        "--format=JobIDRaw,State,Partition,Timelimit,AllocCPUS,Comment",
    )  # fmt: skip
    return parse_jobs(out)


def cpu_override_args(profile: dict, node_mem_mb: int) -> list[str]:
    """``--set-resources`` arguments that run the profile on one CPU-only node.

    The profile's own per-rule resources, except that GPU rules ask for no GPU (gpu=0, no
    gpu_model) and no job asks for more memory than the node has. Snakemake replaces a
    profile's whole ``set-resources`` by the command line's, so every entry is repeated.
    """
    args = []
    for rule, resources in (profile.get("set-resources") or {}).items():
        resources = dict(resources)
        resources.pop("gpu_model", None)
        if "gpu" in resources:
            resources["gpu"] = 0
        if "mem_mb" in resources:
            resources["mem_mb"] = min(int(resources["mem_mb"]), node_mem_mb)
        args += [f"{rule}:{key}={value}" for key, value in resources.items()]
    return ["--set-resources", *args] if args else []


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("start", "stop"):
        print(f"usage: {argv[0]} start|stop STATE_DIR", file=sys.stderr)
        return 2
    root = Path(argv[2]).resolve()
    if argv[1] == "start":
        cluster = LocalSlurm(root).start()
        print(f"export SLURM_CONF={cluster.conf}  # accounting: {cluster.accounting}")
    else:
        LocalSlurm.load(root).stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

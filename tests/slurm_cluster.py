"""A real, throwaway Slurm cluster on this machine for the tests marked `slurm`.

Debian's packages (`slurmctld slurmd slurm-client munge`; .ci/run installs them as it installs
chromium): munge for authentication, one slurmctld, and one slurmd per node, all in the
foreground as children of the test process, every file (keys, sockets, state, spool, logs, the
slurm.conf) under one fresh directory, so nothing of the machine's own configuration is read or
changed and a drained node never outlives its test. Commands reach the cluster through the
`SLURM_CONF` variable in `cluster.env`.

Two nodes on one host are two slurmd daemons with their own names (the host's short name and
`localhost`, both resolving here), ports and spools: a real two-node allocation, as torchrun and
srun see it. Each node has `gpus` fake GPUs (GRES backed by character devices made with mknod),
so `--gpus-per-node` is accepted as on a GPU cluster; nothing runs on them.

`EnforcePartLimits` is off by default, as on many real clusters: a request the partition can
never meet then stays pending rather than being refused at submission, which the launch code
must notice itself.

Stopped by pid: every job is cancelled, then the daemons get SIGTERM (SIGKILL after a few seconds).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")


def missing_programs() -> list[str]:
    """The Slurm and munge programs this machine lacks (empty: a cluster can start)."""
    found = {p: shutil.which(p) or (os.path.exists(f"/usr/sbin/{p}") and f"/usr/sbin/{p}") for p in DAEMONS}
    return [p for p, path in found.items() if not path]


def _program(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SlurmCluster:
    """A started cluster: `env` reaches it (SLURM_CONF), `nodes` are its node names."""

    root: Path
    nodes: list[str]
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster."""
        return subprocess.run(list(argv), env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout, check=check)

    def jobs(self) -> list[tuple[str, str, str]]:
        """(job id, name, state) of every job squeue still lists."""
        out = self.run("squeue", "--noheader", "--format=%i|%j|%T").stdout
        return [tuple(line.split("|", 2)) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def _conf(root: Path, nodes: list[str], ports: list[int], ctld_port: int, gpus: int, enforce: bool) -> str:
    memory = max(256, int(_free_mb() * 0.9) // len(nodes))
    lines = [
        "ClusterName=stagewise-test",
        f"SlurmctldHost={nodes[0]}",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", f"AuthInfo=socket={root / 'munge.socket'}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd'}-%n.pid",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd'}-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none", "MailProg=/bin/true", "ReturnToService=2",
        "MinJobAge=4", "KillWait=2", "InactiveLimit=0", "SchedulerParameters=sched_interval=2",
        f"EnforcePartLimits={'ALL' if enforce else 'NO'}",
        "GresTypes=gpu",
    ]
    for name, port in zip(nodes, ports):
        lines.append(f"NodeName={name} NodeHostname={name} Port={port} CPUs={os.cpu_count() or 1} "
                     f"RealMemory={memory} Gres=gpu:{gpus} State=UNKNOWN")
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _free_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 1024


def _gres(root: Path, nodes: list[str], gpus: int) -> str:
    """One gres.conf line per node over character devices of its own (slurmd drops a count without files)."""
    lines = []
    for name in nodes:
        dev = root / "dev" / name
        dev.mkdir(parents=True, exist_ok=True)
        for i in range(gpus):
            path = dev / f"nvidia{i}"
            if not path.exists():
                os.mknod(path, 0o600 | 0o020000, os.makedev(1, 3))  # a character device, like /dev/null
        lines.append(f"NodeName={name} Name=gpu File={dev}/nvidia[0-{gpus - 1}]")
    return "\n".join(lines) + "\n"


def _wait(what: str, ready, timeout: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}:\n" + (p.read_text()[-2000:] if p.exists() else "(none)") for p in logs)
            raise RuntimeError(f"the test Slurm cluster: {what} not ready after {timeout:.0f} s\n{tails}")
        time.sleep(0.2)


@contextlib.contextmanager
def slurm_cluster(root: Path, nodes: int = 1, gpus: int = 8, enforce_part_limits: bool = False) -> Iterator[SlurmCluster]:
    """Start munge, slurmctld and `nodes` slurmd daemons under `root`, yield the cluster, stop it all."""
    if nodes not in (1, 2):
        raise ValueError("one or two nodes on one host")
    root = Path(root).resolve()
    for sub in ("state", "spool", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    names = [socket.gethostname().split(".")[0], "localhost"][:nodes]
    ports = [_free_port() for _ in names]
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, names, ports, _free_port(), gpus, enforce_part_limits))
    (root / "gres.conf").write_text(_gres(root, names, gpus))
    env = {"SLURM_CONF": str(conf)}
    full_env = {**os.environ, **env}
    procs: list[subprocess.Popen] = []
    cluster = SlurmCluster(root, names, env, procs)

    def start(argv: list[str], log: str) -> None:
        out = open(root / log, "ab")  # noqa: SIM115 - closed with the process, at stop
        procs.append(subprocess.Popen(argv, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True))

    try:
        key = root / "munge" / "munge.key"
        subprocess.run([_program("mungekey"), "-c", "-k", str(key)], check=True, capture_output=True)
        key.chmod(0o600)
        start([_program("munged"), "-F", "--force", "-S", str(root / "munge.socket"), f"--key-file={key}",
               f"--pid-file={root / 'munge' / 'munged.pid'}", f"--log-file={root / 'munge' / 'munged.log'}",
               f"--seed-file={root / 'munge' / 'munged.seed'}"], "munged.out")
        _wait("munged", lambda: (root / "munge.socket").exists(), 20, [root / "munged.out"])
        start([_program("slurmctld"), "-D", "-i", "-f", str(conf)], "slurmctld.out")
        for name in names:
            (root / "spool" / name).mkdir(exist_ok=True)
            start([_program("slurmd"), "-D", "-f", str(conf), "-N", name], f"slurmd-{name}.out")

        def idle() -> bool:
            out = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], env=full_env,
                                 capture_output=True, text=True).stdout.split()
            states = dict(zip(out[::2], out[1::2]))
            return all(states.get(n) == "idle" for n in names)

        _wait("every node idle", idle, 60, [root / "slurmctld.log", *(root / f"slurmd-{n}.log" for n in names)])
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--full", "--user", str(os.getuid())], env=full_env, capture_output=True,
                           timeout=10)
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)

"""A real single-node Slurm cluster for tests: munged, slurmctld and slurmd as root.

Everything lives under one temporary directory (configuration, munge key and socket,
state, spool, logs) and the daemons listen on free ports, so the cluster neither needs
nor touches /etc/slurm, /etc/munge or a system munged. Client commands find it through
``SLURM_CONF`` in :attr:`SlurmCluster.env`.

The node has ``GPUS`` GPUs as Slurm sees them: its ``gpu`` generic resource stands on
character devices that are not GPUs (``/dev/tty0``...), so Slurm schedules, counts and binds
them for real (``--gpus-per-node``, ``--gpus-per-task``, ``--gpu-bind``, each task's
``CUDA_VISIBLE_DEVICES``) while torch finds no CUDA and the ranks train on CPU. Tasks are
bound to cores (``task/affinity``), so ``--cpu-bind`` and ``--cpus-per-gpu`` hold too.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from skyfed.procs import terminate

DAEMONS = ("munged", "slurmctld", "slurmd")
GPUS = 2
READY_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """One node (this host, ``hostname -s``, with the CPUs ``nproc`` counts), one partition
    ``debug``, root's jobs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.node = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: dict[str, subprocess.Popen] = {}

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        missing = [d for d in (*DAEMONS, "sbatch", "sinfo") if shutil.which(d) is None]
        if missing:
            raise RuntimeError(
                f"Slurm test needs {', '.join(missing)} on PATH: install the Debian packages "
                "slurm-wlm and munge (.ci/system-packages does)"
            )
        if os.geteuid() != 0:
            raise RuntimeError("the Slurm test runs slurmd and munged as root; run it as root")
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = self.root / "munge" / "munge.sock"
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            ],
        )
        self._wait(sock.exists, "munged's socket")
        self.conf.write_text(self._slurm_conf(sock))
        devices = ",".join(f"/dev/tty{i}" for i in range(GPUS))
        (self.root / "gres.conf").write_text(f"Name=gpu File={devices}\n")
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        self._wait(lambda: self.node_state() == "idle", f"node {self.node} to be idle in sinfo")

    def stop(self) -> None:
        """Cancel what still runs, then stop the daemons (slurmd first, munged last)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--user=root"], env=self.env, check=False)
        for name in reversed(DAEMONS):
            if name in self.procs:
                terminate(self.procs.pop(name), grace_s=10.0)

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - the child's
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env
        )
        log.close()

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{dead[0]} exited {self.procs[dead[0]].returncode}" if dead else "timeout"
                raise RuntimeError(f"Slurm: waiting for {what}: {why}\n{self.logs()}")
            time.sleep(0.2)

    def _slurm_conf(self, munge_socket: Path) -> str:
        root = self.root
        return f"""\
ClusterName=skyfedtest
GresTypes=gpu
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "log" / "slurmctld.log"}
SlurmdLogFile={root / "log" / "slurmd.log"}
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={len(os.sched_getaffinity(0))} Gres=gpu:{GPUS} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""

    # ---- client commands -----------------------------------------------------------------

    def node_state(self) -> str:
        out = subprocess.run(
            ["sinfo", "--noheader", "--format=%T"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        return out.stdout.strip()

    def sbatch(
        self, *args: str, env: dict[str, str] | None = None, timeout_s: float = 200
    ) -> subprocess.CompletedProcess[str]:
        """``sbatch --wait ARGS``: returns when the job has ended, with its exit status."""
        try:
            return subprocess.run(
                ["sbatch", "--wait", *args],
                env={**self.env, **(env or {})},
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            queue = subprocess.run(
                ["squeue", "--format=%i %T %r"], env=self.env, capture_output=True, text=True
            )
            raise AssertionError(
                f"sbatch job still not done after {timeout_s} s:\n{queue.stdout}{self.logs()}"
            ) from None

    def logs(self) -> str:
        """The daemons' logs, tail of each: what a failing test shows."""
        parts = []
        for path in sorted((self.root / "log").iterdir()):
            text = path.read_text(errors="replace")[-2000:]
            parts.append(f"--- {path.name}\n{text}")
        return "\n".join(parts)

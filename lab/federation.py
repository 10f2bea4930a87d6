"""A real federation in the lab: certificates, then `coordinator serve` and `agent start`."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from skyfed.lab.netns import LabError
from skyfed.lab.topology import COORDINATOR, Lab, LabProcess

logger = logging.getLogger(__name__)

ROUND_LINE = re.compile(
    r"\[Coordinator\.Round\] round=(\d+) closed agents=(\d+).*duration_s=([\d.]+)"
)


@dataclass(kw_only=True, slots=True, frozen=True)
class FederationSpec:
    """How the lab's federation trains."""

    rounds: int = 3
    """Rounds the coordinator runs and every agent waits for."""
    round_deadline_s: float = 30.0
    """After this, a quorum closes a round."""
    quorum: int = 0
    """Contributions that close a round after the deadline; 0 means every agent."""
    port: int = 7443
    """Coordinator port on its lab address."""
    coordinator_args: tuple[str, ...] = ()
    """Extra ``coordinator serve`` options."""
    agent_args: tuple[str, ...] = ()
    """Extra ``agent start`` options."""

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"invalid rounds: {self.rounds!r}")
        if self.round_deadline_s <= 0:
            raise ValueError(f"invalid round_deadline_s: {self.round_deadline_s!r}")
        if self.quorum < 0 or not 0 < self.port < 65536:
            raise ValueError(f"invalid quorum/port: {self.quorum!r}/{self.port!r}")


def cloud_of(agent: str) -> str:
    """An agent's cloud from its name (``aws-1`` is in ``aws``)."""
    return agent.split("-", 1)[0]


class Federation:
    """Coordinator and agents of one lab, with their certificates, logs and reports."""

    def __init__(self, lab: Lab, spec: FederationSpec, workdir: Path) -> None:
        self.lab = lab
        self.spec = spec
        self.workdir = workdir
        self.certs = workdir / "certs"
        self.agents = [a.name for a in lab.spec.agents]
        self.coordinator: LabProcess | None = None
        self.agent_procs: dict[str, LabProcess] = {}

    @property
    def address(self) -> str:
        """Where agents dial the coordinator."""
        return f"{self.lab.address(COORDINATOR)}:{self.spec.port}"

    def issue_certs(self) -> None:
        """A throwaway CA, the coordinator's certificate for its lab address, one per agent."""
        certs = [shutil.which("certs") or "certs"]
        _check_call([*certs, "init", "--dir", str(self.certs)])
        hosts = ["--host", str(self.lab.address(COORDINATOR)), "--host", COORDINATOR]
        _check_call([*certs, "issue", "coordinator", "--dir", str(self.certs), *hosts])
        for name in self.agents:
            issue = ["issue", "agent", "--dir", str(self.certs), "--cloud", cloud_of(name)]
            _check_call([*certs, *issue, "--name", name])

    def start(self) -> None:
        """Issue certificates, start the coordinator, then every agent."""
        self.issue_certs()
        n = len(self.agents)
        argv = ["coordinator", "serve", "--listen", self.address, "--certs", str(self.certs)]
        argv += ["--min-agents", str(n), "--rounds", str(self.spec.rounds)]
        argv += ["--round-deadline-s", str(self.spec.round_deadline_s)]
        argv += ["--quorum", str(self.spec.quorum or n)]
        argv += ["--checkpoint-dir", str(self.workdir / "checkpoints"), *self.spec.coordinator_args]
        self.coordinator = self.lab.spawn(COORDINATOR, argv, log_path=self.log(COORDINATOR))
        for name in self.agents:
            self.start_agent(name)

    def start_agent(self, name: str) -> LabProcess:
        """Start (or restart) one agent, on its own shard of the task's data (as sites of a
        real federation hold different data; on one shard with one seed, every agent would
        draw the same batches and the mean gradient would be one agent's)."""
        argv = ["agent", "start", "--cloud", cloud_of(name), "--name", name]
        argv += ["--shard", str(self.agents.index(name)), "--num-shards", str(len(self.agents))]
        argv += ["--coordinator", self.address, "--certs", str(self.certs)]
        argv += ["--rounds", str(self.spec.rounds), "--report", str(self.report_path(name))]
        proc = self.lab.spawn(name, [*argv, *self.spec.agent_args], log_path=self.log(name))
        self.agent_procs[name] = proc
        return proc

    def log(self, host: str) -> Path:
        """Where a host's command writes its output."""
        return self.workdir / f"{host}.log"

    def report_path(self, agent: str) -> Path:
        """The agent's JSON report, rewritten every round."""
        return self.workdir / f"{agent}.report.json"

    def wait(self, timeout_s: float) -> dict[str, int | None]:
        """Wait until every agent and the coordinator exit; exit codes (None: still running)."""
        procs = {**self.agent_procs}
        if self.coordinator is not None:
            procs[COORDINATOR] = self.coordinator
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in procs.values()):
            time.sleep(0.2)
        return {host: p.popen.poll() for host, p in procs.items()}

    def reports(self) -> dict[str, dict]:
        """Each agent's last report (``weights_digest``, ``round``, ``bytes_up``, ...)."""
        out = {}
        for name in self.agents:
            path = self.report_path(name)
            if path.exists():
                out[name] = json.loads(path.read_text())
        return out

    def rounds(self) -> list[tuple[int, int, float]]:
        """(round, contributors, duration_s) of every closed round, from the coordinator log."""
        text = self.log(COORDINATOR).read_text() if self.log(COORDINATOR).exists() else ""
        return [(int(r), int(a), float(d)) for r, a, d in ROUND_LINE.findall(text)]

    def tail(self, host: str, lines: int = 30) -> str:
        """The end of a host's log, for failure messages."""
        path = self.log(host)
        return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else ""


def round_floor_s(rtt_ms: float, rate_mbit: float, bytes_up: float, bytes_down: float) -> float:
    """The physical floor of one round on a link: a round trip plus both payloads at the rate."""
    serialize_s = (bytes_up + bytes_down) * 8 / (rate_mbit * 1e6) if rate_mbit else 0.0
    return rtt_ms / 1000 + serialize_s


def _check_call(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")

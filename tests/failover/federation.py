"""A federation of coordinator replicas, a real etcd and ``agent start`` processes, for the
state tests (docs/failover.md), and what each agent's log says it applied."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc

from skyfed.certs.authority import CertificateAuthority
from skyfed.coordinator import checkpoint
from skyfed.coordinator.admin import fetch_status
from skyfed.coordinator.replicas.testing import agent_ledger, free_port
from skyfed.fingerprint import weights_digest
from skyfed.procs import Children, command
from skyfed.status import Status

TTL_S = 2
NAMES = ("a", "b", "c")
CLOUDS = ("aws", "gcp", "azure")


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Replicas:
    """Replica processes ``a``, ``b``, ``c`` on free loopback ports, each with its own
    certificate, and what each says it is (its status over mTLS)."""

    def __init__(self, kids: Children, pki: CertificateAuthority, etcd_url: str) -> None:
        self.kids, self.pki, self.etcd_url = kids, pki, etcd_url
        self.ports = {name: free_port() for name in NAMES}
        for name in NAMES:
            pki.issue_coordinator(f"coordinator-{name}", hosts=("127.0.0.1", "localhost"))

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def status(self, name: str) -> Status | None:
        try:
            return fetch_status(self.address(name), self.pki.directory, "ops", timeout_s=2)
        except grpc.RpcError:
            return None

    def leaders(self, names: tuple[str, ...] = NAMES) -> list[tuple[str, int]]:
        """(replica, term) of each replica that says it leads."""
        found = []
        for name in names:
            s = self.status(name)
            if s is not None and s.replicas is not None and s.replicas.leading:
                found.append((name, s.replicas.term))
        return found


class ReplicaFederation(Replicas):
    """Replicas ``a``, ``b``, ``c`` (each with its own checkpoint directory) and agents
    ``aws``, ``gcp``, ``azure``, all on loopback with real mTLS; ``rounds`` rounds."""

    def __init__(
        self, kids: Children, pki: CertificateAuthority, etcd_url: str, work: Path, rounds: int
    ) -> None:
        super().__init__(kids, pki, etcd_url)
        self.work, self.rounds = work, rounds

    def start(self, name: str, env: dict[str, str] | None = None, etcd_url: str = "") -> None:
        flags = {
            "--replica": name,
            "--etcd": etcd_url or self.etcd_url,
            "--listen": f"127.0.0.1:{self.ports[name]}",
            "--certs": self.pki.directory,
            "--lease-ttl-s": TTL_S,
            "--min-agents": len(CLOUDS),
            "--rounds": self.rounds,
            "--codec": "topk",  # a downlink residual that matters
            "--outer-optimizer": "nesterov",  # and an outer momentum
            "--checkpoint-dir": self.work / f"ckpt-{name}",
            "--probe-port": -1,
            "--eval-every": 0,
            "--final-wait-s": 5,
        }
        argv = command("coordinator", "serve", *(str(x) for kv in flags.items() for x in kv))
        self.kids.start(name, argv, env)

    def start_leader_and_standbys(self, env: dict[str, str] | None = None) -> None:
        """``a`` first, with ``env``, leading before ``b`` and ``c`` start."""
        self.start("a", env)
        wait_for(lambda: self.leaders(("a",)), 90, "replica a to lead")
        for name in NAMES[1:]:
            self.start(name)
        wait_for(lambda: all(self.status(n) for n in NAMES[1:]), 90, "the standbys")

    def start_agents(self) -> None:
        addresses = ",".join(self.address(n) for n in NAMES)
        for cloud in CLOUDS:
            flags = {
                "--cloud": cloud,
                "--certs": self.pki.directory,
                "--coordinator": addresses,
                "--local-steps": 1,
                "--reconnect-max-s": 0.5,
                "--report": self.work / f"{cloud}.json",
            }
            args = [str(x) for kv in flags.items() for x in kv]
            env = {"SKYFED_LOG_LEVEL": "DEBUG"}  # each round it applies: [Agent.Phase]
            self.kids.start(cloud, command("agent", "start", *args, "--no-progress"), env)

    def finish(self, timeout_s: float = 300) -> None:
        """Every agent has trained every round and exited 0."""
        deadline = time.monotonic() + timeout_s
        for cloud in CLOUDS:
            left = max(1.0, deadline - time.monotonic())
            code = self.kids.procs[cloud].wait(timeout=left)
            assert code == 0, f"{cloud} exited {code}:\n{self.kids.log(cloud)[-3000:]}"

    def agent_digests(self) -> set[str]:
        import json

        reports = [json.loads((self.work / f"{c}.json").read_text()) for c in CLOUDS]
        assert {r["round"] for r in reports} == {self.rounds - 1}, reports
        return {r["weights_digest"] for r in reports}

    def replica_digest(self, name: str) -> tuple[int, str]:
        """The last round replica ``name``'s checkpoint holds, and its weights' digest."""
        saved = checkpoint.load(self.work / f"ckpt-{name}")
        assert saved is not None, f"replica {name} wrote no checkpoint"
        return saved.round, weights_digest(saved.weights)

    def ledger(self, cloud: str) -> tuple[int, int]:
        """(rounds lost, rounds applied twice) in ``cloud``'s agent log."""
        kept = agent_ledger(self.kids.log(cloud))
        return kept.lost, kept.twice

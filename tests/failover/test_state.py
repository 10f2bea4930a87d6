"""State that survives the leader's loss (docs/failover.md): three replicas as real
processes, a real etcd, three ``agent start`` processes, real mTLS. The leader is killed
in each phase of a round; a standby that replayed its rounds takes over, and every agent
ends bit-identical with every replica, no acknowledged round lost or applied twice. A
replica that was away catches up (a snapshot) and can take over in turn."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from skyfed.certs.authority import CertificateAuthority
from skyfed.coordinator.replicas.testing import EtcdServer
from skyfed.failpoints import ENV, FAILOVER_PHASES
from skyfed.procs import Children
from tests.failover.federation import CLOUDS, NAMES, ReplicaFederation, wait_for

pytestmark = pytest.mark.multiprocess

ROUNDS = 5
KILLED_IN = 2


@pytest.fixture
def group(reaped: Children, pki: CertificateAuthority, etcd: EtcdServer, tmp_path: Path):
    return ReplicaFederation(reaped, pki, etcd.url, tmp_path, ROUNDS)


@pytest.mark.parametrize("phase", FAILOVER_PHASES)
def test_a_leader_killed_in_any_phase_loses_no_acknowledged_round(
    group: ReplicaFederation, phase: str
):
    group.start_leader_and_standbys({ENV: f"{phase}@{KILLED_IN}"})
    group.start_agents()
    killed = group.kids.procs["a"]
    assert killed.wait(timeout=240) == -signal.SIGKILL, group.kids.log("a")[-3000:]
    assert f"[Failpoint] {phase}@{KILLED_IN} reached" in group.kids.log("a")
    group.finish()
    digests = group.agent_digests()
    assert len(digests) == 1, digests
    for cloud in CLOUDS:
        assert group.ledger(cloud) == (0, 0), group.kids.log(cloud)[-3000:]
    for name in NAMES[1:]:  # the new leader and the standby that followed it
        assert group.replica_digest(name) == (ROUNDS - 1, *digests)
    logs = "".join(group.kids.log(n) for n in NAMES[1:])
    assert "cause=lease expired" in logs and "lost_rounds=0" in logs, logs[-3000:]


def test_a_replica_that_rejoins_catches_up_and_can_take_over(group: ReplicaFederation):
    """``b`` is killed and comes back rounds later with an old checkpoint: a snapshot
    brings it level, it follows, and when ``a`` is killed it leads with no round lost."""
    group.rounds = 60  # rounds of the default task are short: enough to outlast b's restart
    group.start("a")
    wait_for(lambda: group.leaders(("a",)), 90, "replica a to lead")
    group.start("b")
    group.start_agents()

    def a_round() -> int:
        s = group.status("a")
        return s.round if s is not None else -1

    wait_for(lambda: a_round() >= 2, 180, "round 2")
    group.kids.procs["b"].send_signal(signal.SIGKILL)
    group.kids.procs["b"].wait(timeout=30)
    away_from = a_round()
    wait_for(lambda: a_round() >= away_from + 2, 180, "two rounds without b")
    group.start("b")

    def b_follows() -> bool:
        s = group.status("a")
        if s is None or s.replicas is None:
            return False
        b = [m for m in s.replicas.members if m.name == "b"]
        return bool(b) and b[0].state == "following" and b[0].lag == 0

    wait_for(b_follows, 120, "b to follow again")
    assert "[Coordinator.Replay] snapshot of round" in group.kids.log("b")
    group.kids.procs["a"].send_signal(signal.SIGKILL)
    group.finish()
    digests = group.agent_digests()
    assert len(digests) == 1, digests
    assert group.replica_digest("b") == (group.rounds - 1, *digests)
    for cloud in CLOUDS:
        assert group.ledger(cloud) == (0, 0), group.kids.log(cloud)[-3000:]
    assert "lost_rounds=0" in group.kids.log("b")

"""Fencing by term (docs/failover.md, "Fencing"): a leader that wakes from a freeze after
a successor was elected cannot release the round it was closing, and an agent refuses
anything from an older term than one it has seen."""

from __future__ import annotations

import logging
import re
import signal
import threading
from pathlib import Path

import pytest

from skyfed.agent.config import AgentConfig
from skyfed.agent.daemon import Agent
from skyfed.agent.launch import _trainer
from skyfed.agent.site import Site
from skyfed.certs.authority import CertificateAuthority
from skyfed.coordinator.replicas.testing import EtcdServer
from skyfed.coordinator.rounds import Rounds
from skyfed.failpoints import ENV
from skyfed.procs import Children
from tests.failover.federation import CLOUDS, NAMES, ReplicaFederation, wait_for

FROZEN_IN = 2


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): state ``T`` in ``/proc/<pid>/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.multiprocess
def test_a_frozen_old_leader_wakes_and_cannot_release_its_round(
    reaped: Children, pki: CertificateAuthority, etcd: EtcdServer, tmp_path: Path
):
    """``a`` freezes in round 2's mean, as a paused VM does: its clock stops, its lease
    runs out, a standby that replayed round 2 is elected. Woken, ``a`` goes on closing
    round 2 as if it still led: its release is refused under its old term, no agent
    applies that round from it, and everyone ends bit-identical."""
    group = ReplicaFederation(reaped, pki, etcd.url, tmp_path, rounds=5)
    group.start_leader_and_standbys({ENV: f"mean@{FROZEN_IN}:stop"})
    old_term = group.leaders(("a",))[0][1]
    group.start_agents()
    frozen = reaped.procs["a"]
    wait_for(lambda: _stopped(frozen.pid), 240, "a to freeze in round 2's mean")
    ((_, term),) = wait_for(lambda: group.leaders(("b", "c")), 30, "a new leader")
    assert term > old_term
    frozen.send_signal(signal.SIGCONT)
    group.finish()
    log = reaped.log("a")
    assert f"round {FROZEN_IN} was not released: term {old_term} ended" in log, log[-3000:]
    assert len(group.agent_digests()) == 1
    for cloud in CLOUDS:
        agent_log = reaped.log(cloud)
        assert group.ledger(cloud) == (0, 0), agent_log[-3000:]
        assert _round_came_under(agent_log, FROZEN_IN) == term, agent_log[-3000:]
    for name in NAMES[1:]:
        assert group.replica_digest(name) == (4, *group.agent_digests())


def _round_came_under(agent_log: str, round_: int) -> int:
    """The term of the session in which the agent applied round ``round_``, or loaded its
    weights (a join logs the weights it loaded first, then itself with its term)."""
    term, loaded = -1, False
    for line in agent_log.splitlines():
        if m := re.search(r"\[Agent\.Join\] .* term=(\d+)", line):
            term = int(m.group(1))
            if loaded:
                return term
        elif f"[Agent.Phase] round={round_} applied" in line:
            return term
        elif f"[Agent.Sync] weights of round {round_} loaded" in line:
            loaded = True
    return -1


def test_an_agent_refuses_a_round_of_an_older_term_than_it_has_seen(
    serve, pki: CertificateAuthority, monkeypatch: pytest.MonkeyPatch, caplog
):
    """A real agent and coordinator over mTLS: the coordinator welcomes it under term 7,
    then closes round 0 under term 3 (a deposed leader's). The agent refuses it with one
    line, looks for the leader, and takes the weights from term 8 instead."""
    running = serve(min_agents=1)
    fed = running.federation
    fed.term = 7
    close = Rounds.close

    def under_an_older_term(self: Rounds) -> None:
        if self.round.number == 0:
            self.fed.term = 3
            close(self)
            self.fed.term = 8
        else:
            close(self)

    monkeypatch.setattr(Rounds, "close", under_an_older_term)
    config = AgentConfig(
        cloud="aws",
        coordinator=f"localhost:{running.port}",
        certs=pki.directory,
        rounds=1,
        reconnect_max_s=0.5,
    )
    site = Site(_trainer(config), sender=config.name)
    agent = Agent(config, site)
    caplog.set_level(logging.INFO, logger="skyfed.agent.daemon")
    try:
        runner = threading.Thread(target=agent.run, daemon=True)
        runner.start()
        runner.join(timeout=120)
        assert not runner.is_alive(), "the agent did not finish"
    finally:
        site.stop()
    refusals = [r.getMessage() for r in caplog.records if "[Agent.Term]" in r.getMessage()]
    assert refusals and all("of term 3: term 7 leads" in line for line in refusals), refusals
    assert "round 0" in refusals[0]
    assert (agent.term, agent.last_round, agent.applied) == (8, 1, 1)  # round 0 never applied

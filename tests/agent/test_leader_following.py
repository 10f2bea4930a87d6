"""Which coordinator replica an agent dials next (agent/leader.py); the agents that follow
a real failover are in tests/failover/test_replicas.py."""

from __future__ import annotations

import pytest

from skyfed.agent.config import AgentConfig
from skyfed.agent.leader import Replicas


def test_a_session_that_ends_dials_the_next_replica_in_turn():
    replicas = Replicas(["a:1", "b:1", "c:1"])
    seen = [replicas.current]
    for _ in range(3):
        assert replicas.failed() is False
        seen.append(replicas.current)
    assert seen == ["a:1", "b:1", "c:1", "a:1"]


def test_the_leader_a_standby_names_is_dialled_first():
    replicas = Replicas(["a:1", "b:1", "c:1"])
    assert replicas.failed(leader="c:1") is True
    assert replicas.current == "c:1"
    replicas.failed()  # the named leader is gone too: back to the list, in turn
    assert replicas.current == "b:1"


def test_a_named_leader_that_does_not_answer_is_not_dialled_again_next():
    # a standby names b (etcd still holds a partitioned leader's key); b black-holes the
    # dial; the next in turn after a is b again, so the agent goes on to c
    replicas = Replicas(["a:1", "b:1", "c:1"])
    assert replicas.failed(leader="b:1") is True
    assert replicas.current == "b:1"
    assert replicas.failed() is False
    assert replicas.current == "c:1"


def test_a_standby_naming_the_address_just_dialled_moves_on():
    replicas = Replicas(["a:1", "b:1"])
    assert replicas.failed(leader="a:1") is False
    assert replicas.current == "b:1"


def test_the_coordinator_option_takes_several_addresses(tmp_path):
    config = AgentConfig(cloud="aws", certs=tmp_path, coordinator="a:7443, b:7443,c:7443")
    assert config.coordinators == ["a:7443", "b:7443", "c:7443"]
    with pytest.raises(ValueError, match="coordinator"):
        AgentConfig(cloud="aws", certs=tmp_path, coordinator="a:7443,b")

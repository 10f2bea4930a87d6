"""An agent facing a coordinator it cannot work with (a weights digest from before v3,
another payload frame version) stops at the start with one line, not round after round."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from skyfed.agent.config import AgentConfig
from skyfed.agent.daemon import Agent
from skyfed.agent.launch import _trainer
from skyfed.agent.link import LinkClosed
from skyfed.agent.site import Site
from skyfed.coordinator.admission import Admission
from skyfed.fingerprint import sha256_weights_digest


def _refusal(running, pki) -> LinkClosed:
    """How one agent's run against ``running`` ends."""
    config = AgentConfig(
        cloud="aws", coordinator=f"localhost:{running.port}", certs=pki.directory, rounds=1
    )
    site = Site(_trainer(config), sender=config.name)
    try:
        with pytest.raises(LinkClosed) as refused:
            Agent(config, site).run()
    finally:
        site.stop()
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "\n" not in refused.value.details
    return refused.value


def test_an_agent_refuses_a_coordinator_naming_weights_by_the_sha256_tree(serve, pki):
    """Its digests would never match ours: resyncing round after round would hide why."""
    running = serve(min_agents=1)
    fed = running.federation
    with fed.cond:  # what a coordinator from before v3 names its weights by
        fed.model.weights_digest = sha256_weights_digest(fed.model.weights)
    details = _refusal(running, pki).details
    assert "from before 'w3:'" in details
    assert "upgrade the coordinator" in details


def test_an_agent_refuses_a_coordinator_speaking_version_1_frames(serve, pki, monkeypatch):
    """Every payload either way would be refused: the agent stops at the welcome instead."""
    welcome = Admission._welcome

    def from_before_the_field(self, session, weights_follow):  # what an old coordinator sends
        return dataclasses.replace(welcome(self, session, weights_follow), frame_version=0)

    monkeypatch.setattr(Admission, "_welcome", from_before_the_field)
    details = _refusal(serve(min_agents=1), pki).details
    assert "speaks payload frames version 1" in details

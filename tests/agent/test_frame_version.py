"""An agent facing a coordinator of another payload frame version stops with one line."""

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


def test_an_agent_refuses_a_coordinator_speaking_version_1_frames(serve, pki, monkeypatch):
    """Every payload either way would be refused: the agent stops at the welcome instead."""
    welcome = Admission._welcome

    def from_before_the_field(self, session, weights_follow):  # what an old coordinator sends
        return dataclasses.replace(welcome(self, session, weights_follow), frame_version=0)

    monkeypatch.setattr(Admission, "_welcome", from_before_the_field)
    running = serve(min_agents=1)
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
    assert "speaks payload frames version 1" in refused.value.details
    assert "\n" not in refused.value.details

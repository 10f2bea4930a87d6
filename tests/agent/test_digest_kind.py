"""An agent facing a coordinator from before the v3 weights digest stops with one line."""

from __future__ import annotations

import grpc
import pytest

from skyfed.agent.config import AgentConfig
from skyfed.agent.daemon import Agent
from skyfed.agent.launch import _trainer
from skyfed.agent.link import LinkClosed
from skyfed.agent.site import Site
from skyfed.fingerprint import sha256_weights_digest


def test_an_agent_refuses_a_coordinator_naming_weights_by_the_sha256_tree(serve, pki):
    """Its digests would never match ours: resyncing round after round would hide why."""
    running = serve(min_agents=1)
    fed = running.federation
    with fed.cond:  # what a coordinator from before v3 names its weights by
        fed.weights_digest = sha256_weights_digest(fed.weights)
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
    assert "from before 'w3:'" in refused.value.details
    assert "upgrade the coordinator" in refused.value.details

"""A revoked identity's open stream ends within seconds, its contribution withdrawn."""

from __future__ import annotations

import time

import grpc
import torch

from skyfed.coordinator.admin import fetch_status
from tests.coordinator.test_bad_input import (
    contribution,
    deltas,
    expected_weights,
    first_chunk_of,
    join,
    send,
)


def test_revoked_agents_open_stream_ends_and_its_contribution_is_withdrawn(serve, raw_agent, pki):
    running = serve(min_agents=2, quorum=1, round_deadline_s=60)
    aws, gcp = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(aws, "aws", "aws-1"), join(gcp, "gcp", "gcp-1")
    header, chunks = contribution(deltas(1))
    send(aws, header, chunks[: first_chunk_of(chunks, 5)])  # half sent, in the sum
    time.sleep(0.3)

    pki.revoke("aws-1")
    revoked_at = time.monotonic()
    code, details = aws.ended(timeout=10)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert "revoked" in details
    assert time.monotonic() - revoked_at < 5

    send(gcp, *contribution(deltas(2)))
    assert gcp.expect("receipt").receipt.accepted
    end = gcp.expect("round_end").round_end
    assert end.contributors == 1
    for got, want in zip(running.federation.model.weights, expected_weights(2), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-7)  # as if aws never sent

    status = fetch_status(f"localhost:{running.port}", pki.directory, "coordinator")
    states = {a.name: a.state for a in status.agents}
    assert states == {"gcp-1": "idle", "aws-1": "revoked"}

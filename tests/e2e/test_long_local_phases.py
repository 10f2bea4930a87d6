"""Long local phases (DiLoCo's tens to hundreds of steps) end to end, as OS processes."""

from __future__ import annotations

import pytest

from skyfed.netinfo import congestion_control

from .test_federation_processes import (
    CLOUDS,
    assert_identical,
    finish,
    start_agent,
    start_coordinator,
)

pytestmark = pytest.mark.multiprocess


def test_long_local_phases_wait_for_every_site_and_end_bit_identical(reaped, tmp_path, pki):
    """A round's deadline bounds the wait for stragglers after the first contribution: a
    local phase far longer than the deadline must not close rounds on the fastest site
    alone (which dropped the others' whole local phase, every round)."""
    work = tmp_path  # pki: the federation's certificates in it
    rounds = 3
    port = start_coordinator(reaped, work, rounds=rounds, **{"--round-deadline-s": 2.0})
    for i, cloud in enumerate(CLOUDS):
        start_agent(reaped, work, port, cloud, i, local_steps=100)
    status = finish(reaped, work, timeout_s=420)
    assert [r["contributors"] for r in status["rounds"]] == [3] * rounds, status["rounds"]
    # each agent's hello said its local steps (the policy's long-phase rule reads them) and
    # its congestion control toward the coordinator (the N policy reads it): on loopback
    # the same as the coordinator's toward the agent
    joins = [
        line for line in reaped.log("coordinator").splitlines() if "[Coordinator.Join]" in line
    ]
    assert len(joins) >= len(CLOUDS) and all("local_steps=100" in j for j in joins), joins
    cc = congestion_control("127.0.0.1").name
    assert all(f"cc={cc} agent_cc={cc}" in j for j in joins), (cc, joins)
    losses = [r["meanLoss"] for r in status["rounds"]]
    assert losses[-1] < losses[0], losses
    assert_identical(work, status, rounds)

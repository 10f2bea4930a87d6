"""An agent whose weights drift off the coordinator's after an aggregate resyncs before
anything trained from them leaves, with real processes; with and without overlap (the
check waits for the next local steps: docs/wan.md, "A round's critical path")."""

from __future__ import annotations

import pytest

from tests.e2e.test_federation_processes import (
    CLOUDS,
    assert_identical,
    finish,
    start_agent,
    start_coordinator,
)

pytestmark = pytest.mark.multiprocess

DRIFT_ROUND = 2


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_drifted_weights_resync_before_a_contribution_leaves_from_them(
    reaped, tmp_path, pki, overlap
) -> None:
    extra: dict[str, object] = {}
    if overlap:
        (tmp_path / "coordinator.toml").write_text("[rounds]\noverlap = true\n")
        extra["--config"] = tmp_path / "coordinator.toml"
    rounds = 6
    port = start_coordinator(reaped, tmp_path, rounds=rounds, **extra)
    drifting = {"SKYFED_FAILPOINT": f"drift@{DRIFT_ROUND}", "SKYFED_LOG_LEVEL": "DEBUG"}
    for i, cloud in enumerate(CLOUDS):
        start_agent(reaped, tmp_path, port, cloud, i, env=drifting if i == 0 else None)
    status = finish(reaped, tmp_path)
    log = reaped.log(CLOUDS[0])
    drifted = log.index(f"[Failpoint] drift@{DRIFT_ROUND} reached")
    caught = log.index(f"after round {DRIFT_ROUND} our weights differ from the coordinator's")
    assert drifted < caught
    assert "[Agent.Sync] weights of round" in log[caught:], "the weights must have followed"
    # The first round trained from the drifted weights (one later with overlap: its steps
    # start before the aggregate is applied) never left: the check came first.
    first = DRIFT_ROUND + 1 + int(overlap)
    assert f"round={first} sent" not in log[drifted:caught]
    assert_identical(tmp_path, status, rounds)

"""Overlap of exchange with compute (docs/wan.md#overlap) with real processes: agents train
round r+1 while round r's exchange is in flight and still end bit-identical."""

from __future__ import annotations

import signal

import pytest

from skyfed.coordinator import checkpoint
from tests.e2e.test_federation_processes import (
    CLOUDS,
    assert_identical,
    finish,
    report,
    start_agent,
    start_coordinator,
    wait_until,
)

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def work(tmp_path, pki):  # noqa: ANN001, ANN201
    (tmp_path / "coordinator.toml").write_text(
        "[rounds]\noverlap = true\n"
    )  # as an operator sets it
    return tmp_path


def overlap(work) -> dict[str, object]:  # noqa: ANN001
    return {"--config": work / "coordinator.toml"}


def test_overlap_keeps_agents_bit_identical_over_ten_rounds(reaped, work) -> None:
    port = start_coordinator(reaped, work, rounds=10, **overlap(work))
    for i, cloud in enumerate(CLOUDS):
        start_agent(reaped, work, port, cloud, i, local_steps=2)
    status = finish(reaped, work)
    losses = [r["meanLoss"] for r in status["rounds"]]
    assert len(losses) == 10
    assert losses[-1] < losses[0] - 0.5, losses  # one round stale, still training
    assert all("overlap=True" in reaped.log(c) for c in CLOUDS)
    assert_identical(work, status, 10)


def test_overlap_resumes_from_checkpoint_and_loses_no_acknowledged_round(reaped, work) -> None:
    rounds = 12
    port = start_coordinator(reaped, work, rounds=rounds, **overlap(work))
    for i, cloud in enumerate(CLOUDS):
        start_agent(reaped, work, port, cloud, i)
    wait_until(lambda: min(report(work, c)["round"] for c in CLOUDS) >= 3, 120, "round 3")
    reaped.stop("coordinator", signal.SIGKILL)
    saved = checkpoint.load(work / "ckpt")
    acknowledged = max(report(work, c)["round"] for c in CLOUDS)
    assert saved is not None and saved.round >= acknowledged, (saved and saved.round, acknowledged)
    start_coordinator(reaped, work, rounds=rounds, listen=f"127.0.0.1:{port}", **overlap(work))
    status = finish(reaped, work)
    assert f"[Coordinator.Resume] round={saved.round + 1}" in reaped.log("coordinator")
    assert_identical(work, status, rounds)


def test_overlapped_local_steps_are_marked_for_the_round_they_contribute_to(reaped, work) -> None:
    """bench/phases.py splits a round from these marks; the overlapped path logged none."""
    rounds = 4
    port = start_coordinator(reaped, work, rounds=rounds, **overlap(work))
    for i, cloud in enumerate(CLOUDS):
        start_agent(reaped, work, port, cloud, i, env={"SKYFED_LOG_LEVEL": "DEBUG"})
    finish(reaped, work)
    for cloud in CLOUDS:
        log = reaped.log(cloud)
        for r in range(rounds):
            begin, end = f"round={r} train_begin at=", f"round={r} train_end at="
            assert begin in log and end in log, (cloud, r)
            assert log.index(begin) < log.index(end) < log.index(f"round={r} sent at="), (cloud, r)

"""A coordinator killed in every phase of a round: restarted, it loses no acknowledged
round, and every agent ends bit-identical (docs/scale.md, Checkpoints)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from skyfed.coordinator import checkpoint
from skyfed.failpoints import ENV, POINTS
from skyfed.procs import Children, command, wait_for_file
from tests.e2e.test_federation_processes import (
    CLOUDS,
    assert_identical,
    finish,
    report,
    start_agent,
)

pytestmark = pytest.mark.multiprocess

ROUNDS = 4
KILLED_IN = 2


def start_coordinator(kids: Children, work: Path, listen: str, env: dict[str, str]) -> int:
    port_file = work / "port"
    port_file.unlink(missing_ok=True)
    flags = {
        "--certs": work / "certs",
        "--listen": listen,
        "--port-file": port_file,
        "--status-file": work / "status.json",
        "--rounds": ROUNDS,
        "--min-agents": 3,
        "--checkpoint-dir": work / "ckpt",
        "--codec": "topk",  # a downlink residual that matters, in every checkpoint
    }
    argv = command("coordinator", "serve", *(str(x) for kv in flags.items() for x in kv))
    return int(wait_for_file(port_file, 60, kids.start("coordinator", argv, env)))


@pytest.mark.parametrize("phase", POINTS)
def test_a_coordinator_killed_in_any_phase_restarts_and_loses_no_acknowledged_round(
    reaped, tmp_path: Path, pki, phase: str
):
    work = tmp_path
    port = start_coordinator(reaped, work, "127.0.0.1:0", {ENV: f"{phase}@{KILLED_IN}"})
    for i, cloud in enumerate(CLOUDS):
        start_agent(reaped, work, port, cloud, i)
    code = reaped.procs["coordinator"].wait(timeout=180)
    log = reaped.log("coordinator")
    assert code == -signal.SIGKILL, f"exit {code}:\n{log[-3000:]}"
    assert f"[Failpoint] {phase}@{KILLED_IN} reached" in log
    acknowledged = max(report(work, c)["round"] for c in CLOUDS)
    saved = checkpoint.load(work / "ckpt")
    assert saved is not None and saved.round >= acknowledged, (saved and saved.round, acknowledged)
    assert acknowledged >= KILLED_IN - 1
    start_coordinator(reaped, work, f"127.0.0.1:{port}", {})
    status = finish(reaped, work)
    assert f"[Coordinator.Resume] round={saved.round + 1}" in reaped.log("coordinator")
    assert_identical(work, status, ROUNDS)

"""A tp agent lives and dies as one: no rank outlives the agent, no agent outlives a rank."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from skyfed.procs import Children, command

pytestmark = pytest.mark.multiprocess


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def start_tp_agent(kids: Children, certs: Path) -> tuple[subprocess.Popen, list[int]]:
    """An agent with two ranks, up and retrying a coordinator that is not there."""
    argv = command(
        "agent", "start", "--cloud", "aws", "--certs", str(certs), "--tp", "2",
        "--device", "cpu", "--coordinator", f"127.0.0.1:{closed_port()}",
    )  # fmt: skip
    proc = kids.start("aws", argv)
    wait_until(lambda: "[Agent.Link] session ended" in kids.log("aws"), 60, "the ranks to be up")
    pids = re.search(r"\[Agent.Ranks\] dp=1 tp=2 device=cpu pids=(\d+),(\d+)", kids.log("aws"))
    assert pids, kids.log("aws")
    return proc, [int(p) for p in pids.groups()]


def test_a_rank_that_dies_takes_the_whole_agent_down(reaped, pki):
    agent, (rank0, rank1) = start_tp_agent(reaped, pki.directory)
    os.kill(rank1, signal.SIGKILL)  # a follower: the session on rank 0 cannot notice by itself
    assert agent.wait(timeout=30) == 128 + signal.SIGKILL
    wait_until(lambda: not alive(rank0), 15, "rank 0 to be stopped")
    assert re.search(r"down: rank 1 \(dp 0, tp 1\) on \S+ killed by SIGKILL", reaped.log("aws"))


def test_a_killed_agent_leaves_no_orphan_rank(reaped, pki):
    agent, ranks = start_tp_agent(reaped, pki.directory)
    agent.kill()
    agent.wait()
    wait_until(lambda: not any(alive(r) for r in ranks), 15, "the ranks to die with the agent")


def test_sigterm_stops_every_rank_and_exits_as_terminated(reaped, pki):
    """Before the federation finished, SIGTERM is a failure to the supervisor (a drain, a
    spot loss: docs/operations.md), never the success that completes a Job."""
    agent, ranks = start_tp_agent(reaped, pki.directory)
    agent.terminate()
    assert agent.wait(timeout=30) == 128 + signal.SIGTERM
    assert not any(alive(r) for r in ranks)

"""A failing rank says why, once: the site goes down with that rank's one line, the
coordinator's status shows it, and the site rejoins when it is started again."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from skyfed.procs import command

pytestmark = pytest.mark.multiprocess

MLP = "skyfed.tasks.examples:mlp_task"


def agent_argv(certs: Path, port: int, work: Path, *extra: object) -> list[str]:
    flags = {
        "--cloud": "gcp",
        "--coordinator": f"localhost:{port}",
        "--certs": certs,
        "--local-steps": 100,
        "--device": "cpu",
        "--state-dir": work / "state",
        "--report": work / "gcp.json",
        "--reconnect-max-s": 0.5,
    }
    words = [str(x) for kv in flags.items() for x in kv]
    return command("agent", "start", *words, *(str(x) for x in extra))


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def applied(work: Path) -> int:
    path = work / "gcp.json"
    return json.loads(path.read_text())["rounds_applied"] if path.exists() else 0


def down_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "[Agent.Site] down:" in line]


def test_a_data_parallel_rank_killed_mid_round_takes_the_site_down_and_it_rejoins(
    serve, reaped, pki, tmp_path
):
    running = serve(rounds=6, codec="topk", task=MLP)
    argv = agent_argv(pki.directory, running.port, tmp_path, "--task", MLP, "--dp", "2")
    site = reaped.start("gcp", argv)
    wait_until(lambda: applied(tmp_path) >= 1, 120, "a first round")
    pids = re.search(r"\[Agent.Ranks\] dp=2 tp=1 device=cpu pids=(\d+),(\d+)", reaped.log("gcp"))
    assert pids, reaped.log("gcp")
    time.sleep(0.3)  # into the next round's local steps
    os.kill(int(pids.group(2)), signal.SIGKILL)
    assert site.wait(timeout=60) == 128 + signal.SIGKILL
    log = reaped.log("gcp")
    (line,) = down_lines(log)
    assert re.search(r"down: rank 1 \(dp 1, tp 0\) on \S+ killed by SIGKILL$", line), line
    assert "Traceback" not in log, log[-3000:]
    fed = running.federation
    wait_until(lambda: [a.state for a in fed.status().agents] == ["down"], 10, "status: down")
    (status,) = fed.status().agents
    assert status.last_error.endswith("killed by SIGKILL"), status.last_error

    # It comes back with another layout: its residuals, kept in logical coordinates,
    # are cut into the new slices.
    argv = agent_argv(pki.directory, running.port, tmp_path, "--task", MLP, "--tp", "2")
    again = reaped.start("gcp-again", argv)
    assert again.wait(timeout=240) == 0, reaped.log("gcp-again")[-3000:]
    assert "resharded onto dp=1 tp=2" in reaped.log("gcp-again")
    report = json.loads((tmp_path / "gcp.json").read_text())
    assert report["weights_digest"] == fed.model.weights_digest and fed.rounds.finished


def test_a_rank_that_cannot_start_says_why_once_and_the_next_hello_tells_it(
    serve, reaped, pki, tmp_path
):
    running = serve(rounds=1, task="tests.agent.failing_task:make")
    argv = agent_argv(
        pki.directory,
        running.port,
        tmp_path,
        "--task",
        "tests.agent.failing_task:make",
        "--dp",
        "2",
    )
    site = reaped.start("gcp", argv)
    assert site.wait(timeout=120) == 1
    log = reaped.log("gcp")
    (line,) = down_lines(log)
    assert "rank 1 (dp 1, tp 0)" in line and "RuntimeError: CUDA error: out of memory" in line
    assert "Traceback" not in log, log[-3000:]
    kept = (tmp_path / "state" / "last-error.txt").read_text()
    assert "CUDA error: out of memory" in kept
    # Started again as one rank (which can build the model), its hello tells the coordinator.
    solo = agent_argv(
        pki.directory, running.port, tmp_path, "--task", "tests.agent.failing_task:make"
    )
    assert reaped.start("gcp-solo", solo).wait(timeout=120) == 0, reaped.log("gcp-solo")[-3000:]
    (status,) = running.federation.status(departed=True).agents
    assert "CUDA error: out of memory" in status.last_error
    assert not (tmp_path / "state" / "last-error.txt").exists(), "told: forgotten"

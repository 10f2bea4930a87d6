"""``coordinator serve`` on a terminal shows a live view; elsewhere plain lines."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import time

import pytest

from skyfed.procs import command, terminate

pytestmark = pytest.mark.multiprocess


def serve_argv(certs, *extra: str) -> list[str]:
    return command(
        "coordinator", "serve", "--certs", str(certs), "--listen", "127.0.0.1:0",
        "--min-agents", "3", "--rounds", "5", *extra,
    )  # fmt: skip


def read_until(fd: int, words: str, timeout_s: float = 60) -> str:
    seen = b""
    deadline = time.monotonic() + timeout_s
    while words.encode() not in seen:
        assert time.monotonic() < deadline, f"{words!r} not shown; got {seen[-1500:]!r}"
        if select.select([fd], [], [], 0.5)[0]:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    return seen.decode(errors="replace")


def test_waiting_coordinator_on_a_terminal_says_for_whom(pki):
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        serve_argv(pki.directory), stdin=follower, stdout=follower, stderr=follower
    )
    os.close(follower)
    try:
        read_until(leader, "waiting for 3 agents, 0 connected")
        proc.send_signal(signal.SIGINT)
        shown = read_until(leader, "skyfed run summary")
        assert proc.wait(timeout=30) == 0, shown
    finally:
        terminate(proc)
        os.close(leader)


def test_without_a_terminal_the_coordinator_logs_plain_lines(pki, reaped):
    proc = reaped.start("coordinator", serve_argv(pki.directory, "--log-format", "text"))
    deadline = time.monotonic() + 60
    while "[Coordinator.Wait]" not in reaped.log("coordinator"):
        assert time.monotonic() < deadline, reaped.log("coordinator")[-2000:]
        time.sleep(0.2)
    reaped.stop("coordinator")
    log = reaped.log("coordinator")
    assert "waiting for 3 agents, 0 connected" in log
    assert "\x1b[" not in log.split("skyfed run summary")[0]  # no live view's escapes
    assert proc.returncode == 0


def test_status_watch_redraws_until_interrupted(serve, pki, reaped):
    running = serve(min_agents=2)
    argv = command(
        "coordinator", "status", "--coordinator", f"localhost:{running.port}",
        "--certs", str(pki.directory), "--watch", "--interval-s", "0.2",
    )  # fmt: skip
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    try:
        shown = read_until(leader, "waiting for 2 agents, 0 connected")
        shown += read_until(leader, "exchange delta")  # the table under it
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, shown
        assert "round 0" in shown
    finally:
        terminate(proc)
        os.close(leader)

"""A real ``agent start`` ended by SIGTERM (a node drain, a spot loss) before the
federation finished exits non-zero, so its Kubernetes Job or supervisor restarts it."""

from __future__ import annotations

import signal
import time

import pytest

from skyfed.agent.launch import EXIT_TERMINATED
from skyfed.coordinator.admin import fetch_status
from skyfed.procs import command

pytestmark = pytest.mark.multiprocess


def wait_joined(address: str, pki, name: str, proc, reaped, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        status = fetch_status(address, pki.directory, "coordinator")
        if any(a.name == name and a.state != "disconnected" for a in status.agents):
            return
        assert proc.poll() is None, reaped.log(name)[-2000:]
        assert time.monotonic() < deadline, f"{name} never joined: {reaped.log(name)[-2000:]}"
        time.sleep(0.2)


@pytest.mark.parametrize("tp", [1, 2])
def test_agent_ended_by_sigterm_before_the_end_exits_non_zero(serve, pki, reaped, tp):
    running = serve(min_agents=2)  # one agent alone: the federation never finishes
    address = f"localhost:{running.port}"
    flags = ["--cloud", "aws", "--coordinator", address, "--certs", str(pki.directory)]
    proc = reaped.start("aws-1", command("agent", "start", *flags, "--tp", str(tp)))
    wait_joined(address, pki, "aws-1", proc, reaped)

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == EXIT_TERMINATED, reaped.log("aws-1")[-2000:]
    assert "Traceback" not in reaped.log("aws-1")

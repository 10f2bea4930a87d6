"""A real ``agent start``: healthy at once, ready only once it is in a session."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import pytest

from skyfed.procs import command

pytestmark = pytest.mark.multiprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def test_agent_without_a_session_is_healthy_but_not_ready(pki, reaped):
    port, nowhere = free_port(), free_port()
    flags = [
        "--cloud", "aws", "--coordinator", f"localhost:{nowhere}", "--certs", str(pki.directory),
        "--metrics-listen", f"127.0.0.1:{port}",
    ]  # fmt: skip
    reaped.start("aws", command("agent", "start", *flags))
    deadline = time.monotonic() + 60
    while probe(port, "/healthz") != 200:
        assert reaped.procs["aws"].poll() is None, reaped.log("aws")[-2000:]
        assert time.monotonic() < deadline, "the agent's metrics port never answered"
        time.sleep(0.2)
    assert probe(port, "/readyz") == 503


def test_agent_refuses_a_public_metrics_address_without_opt_in(pki, reaped):
    flags = ["--cloud", "aws", "--certs", str(pki.directory), "--metrics-listen", "0.0.0.0:9"]
    proc = reaped.start("aws", command("agent", "start", *flags))
    assert proc.wait(timeout=60) == 2
    assert "metrics_public" in reaped.log("aws")

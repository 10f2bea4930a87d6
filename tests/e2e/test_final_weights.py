"""An agent down at the last round still gets the final weights."""

from __future__ import annotations

import time

import pytest

from skyfed.procs import Children, command, wait_for_file
from tests.conftest import RawAgent, credentials
from tests.coordinator.test_bad_input import contribution, deltas, join, send

pytestmark = pytest.mark.multiprocess
SKIP = ("heartbeat", "chunk", "receipt")


def test_agent_down_at_the_last_round_fetches_the_final_weights_after_the_end(pki, tmp_path):
    kids = Children(tmp_path / "logs")
    port_file = tmp_path / "port"
    argv = command(
        "coordinator",
        "serve",
        *("--certs", str(pki.directory), "--listen", "127.0.0.1:0", "--codec", "fp32"),
        *("--port-file", str(port_file), "--rounds", "2", "--min-agents", "2"),
        *("--final-wait-s", "30"),
    )
    agents: list[RawAgent] = []
    try:
        proc = kids.start("coordinator", argv)
        port = int(wait_for_file(port_file, 60, proc))

        def agent(name: str) -> RawAgent:
            agents.append(RawAgent(port, credentials(pki.directory, name)))
            return agents[-1]

        aws, gcp = agent("aws-1"), agent("gcp-1")
        join(aws, "aws", "aws-1"), join(gcp, "gcp", "gcp-1")
        send(aws, *contribution(deltas(1)))
        send(gcp, *contribution(deltas(2)))
        assert gcp.expect("round_end", skip=SKIP).round_end.round == 0
        assert aws.expect("round_end", skip=SKIP).round_end.round == 0
        gcp.close()  # down for the last round
        time.sleep(0.5)
        send(aws, *contribution(deltas(3), round=1))
        assert aws.expect("round_end", skip=SKIP).round_end.final
        aws.close()  # as an agent does once it applied the final round
        time.sleep(3)  # the old coordinator had stopped by now: no stream was open
        assert proc.poll() is None, kids.log("coordinator")[-2000:]
        back = agent("gcp-1")
        assert join(back, "gcp", "gcp-1").weights_follow
        end = back.expect("weights_end").weights_end
        assert end.final and end.round == 1
        back.close()  # as an agent does once it has the final weights
        assert proc.wait(timeout=20) == 0  # everyone owed the weights had them: it stops
    finally:
        for a in agents:
            a.close()
        kids.stop_all()

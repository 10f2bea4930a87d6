"""After the last round: the coordinator waits for its agents to take it, and a latecomer
gets the final weights and is told the federation has finished."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from skyfed.compression import frame
from skyfed.procs import command
from skyfed.proto import federation_pb2 as pb
from skyfed.proto.serde import specs_to_proto

from .test_bad_input import contribution, deltas, join, model_and_spec, send


def finish_one_round(agent) -> None:
    join(agent, "aws", "aws-1")
    send(agent, *contribution(deltas(1)))
    assert agent.expect("receipt").receipt.accepted
    assert agent.expect("round_end").round_end.final


def test_the_coordinator_serves_on_until_its_agents_close_after_the_last_round(serve, raw_agent):
    running = serve(rounds=1, final_wait_s=30)
    agent = raw_agent(running.port, "aws-1")
    finish_one_round(agent)
    time.sleep(1.0)
    # The final round may still be on its way over a slow link: the stream stays open.
    assert running.driver.is_alive()
    assert None not in list(agent.inbox.queue)  # None: the stream ended
    agent.close()
    running.driver.join(timeout=5)
    assert not running.driver.is_alive()


def test_an_agent_that_never_closes_is_let_go_after_final_wait_s(serve, raw_agent):
    running = serve(rounds=1, final_wait_s=0.5)
    agent = raw_agent(running.port, "aws-1")
    finish_one_round(agent)
    code, _ = agent.ended(timeout=5)
    assert code == grpc.StatusCode.OK
    running.driver.join(timeout=5)
    assert not running.driver.is_alive()


def test_an_agent_joining_after_the_last_round_gets_the_final_weights(serve, raw_agent):
    running = serve(rounds=1, final_wait_s=30)
    finish_one_round(raw_agent(running.port, "aws-1"))  # keeps the coordinator up
    late = raw_agent(running.port, "gcp-1")
    _, spec = model_and_spec()
    # It claims to be current: it must still get the weights, or it would wait for a round
    # that never opens.
    late.send(
        hello=pb.Hello(
            frame_version=frame.VERSION,
            cloud="gcp",
            name="gcp-1",
            task="chargpt",
            tensors=specs_to_proto(spec),
            codecs=["fp32"],
            last_round=0,
            weights_digest=running.federation.model.weights_digest,
        )
    )
    assert late.expect("welcome").welcome.weights_follow
    end = late.expect("weights_end").weights_end
    assert end.final
    assert (end.round, end.weights_digest) == (0, running.federation.model.weights_digest)


@pytest.mark.multiprocess
def test_an_agent_process_that_missed_the_last_round_takes_the_final_weights_and_exits(
    serve, raw_agent, reaped, pki, tmp_path
):
    running = serve(rounds=1, final_wait_s=60)
    finish_one_round(raw_agent(running.port, "aws-1"))  # keeps the coordinator up
    report = tmp_path / "gcp.json"
    flags = ("--cloud", "gcp", "--coordinator", f"localhost:{running.port}")
    flags += ("--certs", str(pki.directory), "--report", str(report))
    proc = reaped.start("gcp", command("agent", "start", *flags))
    assert proc.wait(timeout=120) == 0, reaped.log("gcp")[-3000:]
    rep = json.loads(report.read_text())
    assert (rep["round"], rep["weights_digest"]) == (0, running.federation.model.weights_digest)

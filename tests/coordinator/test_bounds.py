"""Every field of every agent message is bounded before use; a failing round driver ends
the process non-zero with the reason (docs/security.md, "Bounded messages")."""

from __future__ import annotations

import json
import shutil
import subprocess

import grpc
import pytest

from skyfed.procs import Children, command, wait_for_file
from skyfed.proto import federation_pb2 as pb
from tests.conftest import RawAgent, credentials
from tests.coordinator.test_bad_input import contribution, deltas, join, send

U64 = (1 << 64) - 1
U32 = (1 << 32) - 1


def test_contribution_with_overflowing_raw_bytes_is_refused_and_rounds_go_on(
    serve, raw_agent, tmp_path
):
    status_file = tmp_path / "status.json"
    running = serve(min_agents=1, status_file=status_file)
    bad = raw_agent(running.port, "azure-1")
    join(bad, "azure", "azure-1")
    bad.send(contribution=pb.Contribution(round=0, chunks=1, samples=1, raw_bytes=U64))
    code, details = bad.ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "contribution.raw_bytes" in details

    good = raw_agent(running.port, "aws-1")
    join(good, "aws", "aws-1")
    send(good, *contribution(deltas(1)))
    assert good.expect("receipt").receipt.accepted
    assert good.expect("round_end").round_end.round == 0
    assert running.driver.is_alive()
    status = json.loads(wait_for_file(status_file, 10))
    assert status["rounds"][0]["contributors"] == 1


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (pb.AgentMessage(contribution=pb.Contribution(round=0, chunks=1, samples=U32)), "samples"),
        (
            pb.AgentMessage(
                contribution=pb.Contribution(round=0, chunks=1, samples=1, loss=float("nan"))
            ),
            "contribution.loss",
        ),
        (
            pb.AgentMessage(
                contribution=pb.Contribution(round=0, chunks=1, samples=1, train_s=float("inf"))
            ),
            "contribution.train_s",
        ),
        (
            pb.AgentMessage(contribution=pb.Contribution(round=1 << 62, chunks=1, samples=1)),
            "contribution.round",
        ),
        (
            pb.AgentMessage(
                contribution=pb.Contribution(round=0, chunks=1, samples=1, metrics={"a\nb": 1})
            ),
            "contribution.metrics",
        ),
        (
            pb.AgentMessage(
                contribution=pb.Contribution(
                    round=0, chunks=1, samples=1, metrics={"acc": float("nan")}
                )
            ),
            "contribution.metrics",
        ),
        (
            pb.AgentMessage(
                contribution=pb.Contribution(
                    round=0, chunks=1, samples=1, metrics={f"m{i}": 1.0 for i in range(17)}
                )
            ),
            "contribution.metrics",
        ),
        (pb.AgentMessage(heartbeat=pb.Heartbeat(rtt_ms=float("nan"))), "heartbeat.rtt_ms"),
        (pb.AgentMessage(heartbeat=pb.Heartbeat(rtt_ms=-5.0)), "heartbeat.rtt_ms"),
        (
            pb.AgentMessage(heartbeat=pb.Heartbeat(probes_settled=3, probes_lost=U64)),
            "heartbeat.probes_lost",
        ),
        (
            pb.AgentMessage(chunk=pb.Chunk(round=0, shard=pb.Shard(dim=U32, offset=0, length=1))),
            "chunk.shard.dim",
        ),
        (pb.AgentMessage(chunk=pb.Chunk(round=0, kind=7)), "chunk.kind"),
        (pb.AgentMessage(chunk=pb.Chunk(round=0, codec="x" * 1000)), "chunk.codec"),
        (
            pb.AgentMessage(contribution=pb.Contribution(round=0, chunks=U32, samples=1)),
            "contribution.chunks",
        ),
        (
            pb.AgentMessage(contribution_end=pb.ContributionEnd(round=0, chunks=U32)),
            "contribution_end.chunks",
        ),
        (
            pb.AgentMessage(contribution_end=pb.ContributionEnd(round=0, chunks=0)),
            "contribution_end.chunks",
        ),
        (
            pb.AgentMessage(contribution_end=pb.ContributionEnd(round=-1, chunks=1)),
            "contribution_end.round",
        ),
    ],
    ids=[
        "samples-u32",
        "loss-nan",
        "train-inf",
        "round-huge",
        "metric-name-newline",
        "metric-nan",
        "metrics-too-many",
        "rtt-nan",
        "rtt-negative",
        "lost-over-settled",
        "shard-dim",
        "chunk-kind",
        "codec-long",
        "chunks-u32",
        "end-chunks-u32",
        "end-no-chunks",
        "end-round-negative",
    ],
)
def test_field_out_of_bounds_is_invalid_argument_naming_the_field(serve, raw_agent, message, field):
    running = serve(min_agents=2)
    bad = raw_agent(running.port, "azure-1")
    join(bad, "azure", "azure-1")
    bad._out.put(message)
    code, details = bad.ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in details and "out of bounds" in details


def test_hello_with_a_huge_field_is_invalid_argument(serve, raw_agent):
    running = serve()
    bad = raw_agent(running.port, "aws-1")
    bad.send(hello=pb.Hello(cloud="aws", name="aws-1", tp=U32, last_round=-1))
    code, details = bad.ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "hello.tp" in details


def test_round_driver_failure_ends_the_process_non_zero_with_the_reason(pki, tmp_path):
    """A checkpoint save that fails (its directory replaced by a file) fails the round
    driver: the process must end non-zero and say why, not serve on with no rounds."""
    kids = Children(tmp_path / "logs")
    ckpt, port_file = tmp_path / "ckpt", tmp_path / "port"
    argv = command(
        "coordinator",
        "serve",
        *("--certs", str(pki.directory), "--listen", "127.0.0.1:0", "--codec", "fp32"),
        *("--port-file", str(port_file), "--checkpoint-dir", str(ckpt)),
        *("--status-file", str(tmp_path / "status.json")),
    )
    try:
        proc = kids.start("coordinator", argv)
        port = int(wait_for_file(port_file, 60, proc))
        shutil.rmtree(ckpt, ignore_errors=True)
        ckpt.write_text("not a directory")
        agent = RawAgent(port, credentials(pki.directory, "aws-1"))
        try:
            join(agent, "aws", "aws-1")
            send(agent, *contribution(deltas(1)))
            try:
                rc = proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"coordinator still running after its driver failed:\n{kids.log('coordinator')[-2000:]}"
                )
        finally:
            agent.close()
        assert rc != 0
        assert "round driver failed" in kids.log("coordinator")
    finally:
        kids.stop_all()

"""One identity cannot hold the server: streams owe a hello soon, and are bounded per
identity; a second hello and unparseable bytes are refused cleanly (docs/security.md)."""

from __future__ import annotations

import logging
import queue
import time

import grpc
import pytest

from skyfed.coordinator.admin import fetch_status
from skyfed.coordinator.streams import StreamsConfig
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import federation_pb2_grpc as pb_grpc
from tests.conftest import credentials
from tests.coordinator.test_bad_input import join
from tests.striping import test_striped_sessions as striped

SESSION = "/skyfed.v1.Federation/Session"
OPENED = "[Federation.Session] agent=spiffe://skyfed.local/cloud/aws/agent/aws-1 "
"""Logged once a session stream of aws-1 has sent its first message (it is counted from
the moment it opens)."""


def test_stream_that_sends_no_hello_ends_with_deadline_exceeded(serve, raw_agent):
    running = serve(hello_timeout_s=0.5)
    silent = raw_agent(running.port, "aws-1")
    started = time.monotonic()
    code, details = silent.ended(timeout=10)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "hello_timeout_s" in details
    assert time.monotonic() - started < 5


def test_one_identity_cannot_lock_others_out(serve, raw_agent, pki, caplog):
    running = serve(max_streams_per_identity=3, hello_timeout_s=60)
    hogs = [raw_agent(running.port, "aws-1") for _ in range(3)]
    time.sleep(0.5)  # all three are open and owe a hello
    with caplog.at_level(logging.WARNING):
        extra = raw_agent(running.port, "aws-1")
        code, details = extra.ended()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_streams_per_identity=3" in details
    assert "max_streams_per_identity=3" in caplog.text  # logged when hit

    other = raw_agent(running.port, "gcp-1")
    assert join(other, "gcp", "gcp-1").round == 0
    status = fetch_status(f"localhost:{running.port}", pki.directory, "coordinator")
    assert [a.name for a in status.agents] == ["gcp-1"]
    hogs[0].close()
    time.sleep(0.5)
    assert join(raw_agent(running.port, "aws-1"), "aws", "aws-1").round == 0


def test_second_hello_on_one_session_is_refused(serve, raw_agent):
    running = serve()
    agent = raw_agent(running.port, "aws-1")
    join(agent, "aws", "aws-1")
    agent.send(hello=pb.Hello(cloud="aws", name="aws-1", last_round=-1))
    code, details = agent.ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "second hello" in details


def test_unparseable_bytes_are_invalid_argument_with_one_log_line(serve, pki, caplog):
    running = serve()
    creds = credentials(pki.directory, "aws-1")
    with (
        caplog.at_level(logging.WARNING),
        grpc.secure_channel(f"localhost:{running.port}", creds) as channel,
    ):
        call = channel.stream_stream(SESSION, request_serializer=None, response_deserializer=None)
        codes = []
        for _ in range(20):
            replies = call(iter([b"\xff\xff\xff\xff garbage"]))
            try:
                for _ in replies:
                    pass
            except grpc.RpcError as exc:
                codes.append((exc.code(), exc.details()))
    assert {c for c, _ in codes} == {grpc.StatusCode.INVALID_ARGUMENT}, codes
    assert "no AgentMessage" in codes[0][1]
    assert "Traceback" not in caplog.text
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert 1 <= len(refusals) <= 2, [r.getMessage() for r in refusals]


def test_a_striped_sessions_connections_count_once_against_the_limit(serve, raw_agent, pki, caplog):
    running = serve(
        max_chunk_bytes=striped.CHUNK,
        streams=StreamsConfig(min_streams=4, max_streams=4),
        heartbeat_ms=100,
        max_streams_per_identity=2,
        hello_timeout_s=60,
    )
    link = striped.open_link(running.port, pki.directory, max_streams=4)
    try:
        striped.join(link, max_streams=4)
        striped.wait_for_stripes(running, stripes=3)  # four connections of aws-1 now
        striped.contribute(link, seed=1)
        striped.assert_round_exact(running, link, seed=1)
        with caplog.at_level(logging.INFO, logger="skyfed.coordinator.service"):
            # A reconnect's overlapping stream (the second), past its first message:
            raw_agent(running.port, "aws-1").send(heartbeat=pb.Heartbeat())
            deadline = time.monotonic() + 10
            while not any(OPENED in r.getMessage() for r in caplog.records):  # it is counted
                assert time.monotonic() < deadline, "the second stream never opened"
                time.sleep(0.02)
        code, details = raw_agent(running.port, "aws-1").ended()
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "already holds 2 open streams" in details  # the striped session is one of them
    finally:
        link.close()


def test_a_session_holds_no_more_stripes_than_its_max_streams_allow(serve, pki):
    running = serve(
        max_chunk_bytes=striped.CHUNK,
        streams=StreamsConfig(min_streams=2, max_streams=2),
        heartbeat_ms=100,
    )
    link = striped.open_link(running.port, pki.directory, max_streams=2)
    channels = []
    try:
        token = striped.join(link, max_streams=2).stripe_token
        striped.wait_for_stripes(running, stripes=1)

        def stripe() -> grpc.Call:
            channels.append(grpc.secure_channel(f"localhost:{running.port}", creds))
            requests = queue.Queue()
            requests.put(pb.AgentMessage(stripe_join=pb.StripeJoin(token=token)))
            stub = pb_grpc.FederationStub(channels[-1])
            return stub.Stripe(iter(requests.get, None))

        creds = credentials(pki.directory, "aws-1")
        overlapping = stripe()  # a redial overlapping its lane's dying connection: allowed
        striped.wait_for_stripes(running, stripes=2)
        with pytest.raises(grpc.RpcError) as refused:
            next(stripe())
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "already holds 2 stripes" in refused.value.details()
        overlapping.cancel()  # its old connection's redial is done: back to the lane
        striped.wait_for_stripes(running, stripes=1)
        striped.contribute(link, seed=1)  # the session goes on untouched
        striped.assert_round_exact(running, link, seed=1)
    finally:
        for channel in channels:
            channel.close()
        link.close()

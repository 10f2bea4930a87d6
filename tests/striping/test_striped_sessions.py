"""Striped sessions over real TLS connections: each stripe its own TCP connection under the
agent's identity; a stripe cut mid-upload or mid-broadcast loses nothing and counts nothing
twice; a stripe of another identity, or of no session, is refused (docs/striping.md)."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import grpc
import pytest
import torch

from skyfed.agent.config import AgentConfig
from skyfed.agent.link import Link, open_channel
from skyfed.compression import decode_payload, make_codec
from skyfed.coordinator.admin import efficiency_table
from skyfed.coordinator.streams import StreamsConfig
from skyfed.fingerprint import weights_digest
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import federation_pb2_grpc as pb_grpc
from skyfed.proto import serde
from skyfed.proto.chunks import Assembler, cut_all
from skyfed.wire import (
    Announce,
    Chunk,
    ChunkKind,
    Hello,
    Payload,
    Receipt,
    RoundEnd,
    Welcome,
    max_payload_bytes,
)

from ..conftest import credentials
from ..coordinator.test_bad_input import SAMPLES, deltas, expected_weights, model_and_spec
from .proxy import CuttingRelay

CHUNK = 8192  # 548 kB of FP32 chargpt: 67 chunks a transfer, plenty to cut into
STREAMS = 3


def serve_striped(serve, streams: int = STREAMS):
    """A coordinator whose links run on exactly ``streams`` connections."""
    fixed = StreamsConfig(min_streams=streams, max_streams=streams)
    return serve(max_chunk_bytes=CHUNK, streams=fixed, heartbeat_ms=100)


def open_link(port: int, certs: Path, max_streams: int = STREAMS) -> Link:
    config = AgentConfig(
        cloud="aws",
        name="aws-1",
        coordinator=f"localhost:{port}",
        certs=certs,
        max_streams=max_streams,
    )
    return Link(open_channel(config), dial=lambda: open_channel(config, own_connection=True))


def expect(link: Link, kind: type, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = link.recv(timeout=0.2)
        if isinstance(message, kind):
            return message
    raise AssertionError(f"no {kind.__name__} within {timeout} s")


def join(link: Link, max_streams: int = STREAMS) -> Welcome:
    weights, spec = model_and_spec()
    link.send(
        Hello(
            cloud="aws",
            name="aws-1",
            task="chargpt",
            tensors=list(spec),
            tp=1,
            codecs=("fp32",),
            last_round=-1,
            weights_digest=weights_digest(weights),
            exchanges=("delta",),
            max_streams=max_streams,
        )
    )
    welcome = expect(link, Welcome)
    link.start_heartbeats(0.1)  # their acknowledgements let senders forget what arrived
    return welcome


def wait_for_stripes(running, stripes: int = STREAMS - 1) -> None:
    """Until the coordinator holds the session's stripes (their TLS handshakes are done)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if [s.stripes for s in running.federation.admission.sessions.values()] == [stripes]:
            return
        time.sleep(0.02)
    raise AssertionError("the stripes never joined")


def contribute(link: Link, seed: int, round_: int = 0) -> None:
    fp32 = make_codec("fp32")
    payloads = [Payload(i, None, "fp32", fp32.encode(d)) for i, d in enumerate(deltas(seed))]
    chunks = cut_all(payloads, kind=ChunkKind.GRADIENT, round=round_, max_chunk_bytes=CHUNK)
    link.send(Announce(round=round_, chunks=len(chunks), samples=SAMPLES))
    for chunk in chunks:
        link.send(chunk)


def receive_aggregate(link: Link, round_: int = 0) -> tuple[list[torch.Tensor], RoundEnd]:
    """The round's aggregate as the agent's daemon takes it: every chunk checked in order."""
    _, spec = model_and_spec()
    assembler = Assembler(
        kind=ChunkKind.AGGREGATE,
        round=round_,
        num_tensors=len(spec),
        max_chunk_bytes=CHUNK,
        max_payload_bytes=max_payload_bytes(spec),
    )
    values: dict[int, torch.Tensor] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = link.recv(timeout=0.2)
        if isinstance(message, Chunk):
            payload = assembler.add(message)
            if payload is not None:
                values[payload.tensor] = decode_payload(
                    payload.data, shape=spec[payload.tensor].shape
                )
        elif isinstance(message, RoundEnd):
            assert message.chunks == assembler.next_seq
            return [values[i] for i in range(len(spec))], message
    raise AssertionError("no round end")


def assert_round_exact(running, link: Link, seed: int) -> None:
    """The round's aggregate, on both ends, is exactly that of a fault-free one."""
    receipt = expect(link, Receipt)
    assert receipt.accepted, receipt
    aggregate, end = receive_aggregate(link)
    want = expected_weights(seed)
    assert end.weights_digest == weights_digest(want)
    weights, _ = model_and_spec()
    for got, w, new in zip(aggregate, weights, want, strict=True):
        assert torch.equal(w - got, new)  # the agent applies exactly what the coordinator did
    for got, new in zip(running.federation.model.weights, want, strict=True):
        assert torch.equal(got, new)


@pytest.fixture
def relay_to():
    relays: list[CuttingRelay] = []

    def make(port: int) -> CuttingRelay:
        relays.append(CuttingRelay(port))
        return relays[-1]

    yield make
    for r in relays:
        r.close()


def test_each_stripe_is_its_own_tcp_connection_of_the_one_session(serve, pki, relay_to):
    running = serve_striped(serve)
    relay = relay_to(running.port)
    link = open_link(relay.port, pki.directory)
    try:
        welcome = join(link)
        assert welcome.stripe_token and welcome.streams == STREAMS
        wait_for_stripes(running)
        contribute(link, seed=1)
        assert_round_exact(running, link, seed=1)
        assert len(relay.connections) == STREAMS  # one TCP connection per stripe
        assert all(c.up_bytes > CHUNK for c in relay.connections)  # each carried chunks
        (session,) = running.federation.admission.sessions.values()
        monitor = running.federation.links.get(session).monitor
        deadline = time.monotonic() + 10
        while not monitor.rtt_samples and time.monotonic() < deadline:
            time.sleep(0.05)  # the floor needs a round trip; heartbeats bring the first
        contribute(link, seed=3, round_=1)  # carries round 0's timing
        assert expect(link, Receipt).accepted
        status = running.federation.status()
        assert [(a.name, a.streams) for a in status.agents] == [("aws-1", STREAMS)]
        (e,) = status.rounds[0].links
        assert (e.name, e.round, e.streams) == ("aws-1", 0, STREAMS)
        assert e.floor_s > 0 and e.exchange_s > 0  # loopback: no claim about their ratio
        assert e.ratio == pytest.approx(e.exchange_s / e.floor_s)
        assert status.agents[0].efficiency == e
        assert "floorS" in serde.status_to_json(status)
        assert efficiency_table(status) is not None
    finally:
        link.close()


def test_a_stripe_cut_mid_upload_loses_nothing_and_counts_nothing_twice(serve, pki, relay_to):
    running = serve_striped(serve)
    relay = relay_to(running.port)
    relay.arm(1, up_bytes=40 << 10)  # the first stripe, a few chunks into the upload
    link = open_link(relay.port, pki.directory)
    try:
        join(link)
        wait_for_stripes(running)
        contribute(link, seed=1)
        assert_round_exact(running, link, seed=1)
        assert relay.cut_done.is_set()
        assert link.stripes is not None and link.stripes.ended == 1
        assert link._outbox.spread.resent > 0  # its chunks went over the other connections
    finally:
        link.close()


def test_a_stripe_cut_mid_broadcast_loses_nothing(serve, pki, relay_to):
    running = serve_striped(serve)
    relay = relay_to(running.port)
    relay.arm(2, down_bytes=40 << 10)  # the second stripe, inside the aggregate
    link = open_link(relay.port, pki.directory)
    try:
        join(link)
        wait_for_stripes(running)
        contribute(link, seed=2)
        assert_round_exact(running, link, seed=2)
        assert relay.cut_done.is_set()
        (session,) = running.federation.admission.sessions.values()
        assert session.outbox.spread.resent > 0
    finally:
        link.close()


def _stripe_call(port: int, certs: Path, name: str, first: pb.AgentMessage | None):
    channel = grpc.secure_channel(f"localhost:{port}", credentials(certs, name))
    requests = [first] if first is not None else [pb.AgentMessage(chunk=pb.Chunk())]
    try:
        for _ in pb_grpc.FederationStub(channel).Stripe(iter(requests), timeout=10):
            pass
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    finally:
        channel.close()
    return grpc.StatusCode.OK, ""


def test_a_stripe_of_another_identity_or_of_no_session_is_refused(serve, pki):
    running = serve_striped(serve)
    link = open_link(running.port, pki.directory)
    try:
        token = join(link).stripe_token
        join_msg = pb.AgentMessage(stripe_join=pb.StripeJoin(token=token))
        code, details = _stripe_call(running.port, pki.directory, "gcp-1", join_msg)
        assert code == grpc.StatusCode.PERMISSION_DENIED, details
        assert "another agent's session" in details
        stale = pb.AgentMessage(stripe_join=pb.StripeJoin(token=secrets.token_bytes(16)))
        code, details = _stripe_call(running.port, pki.directory, "aws-1", stale)
        assert code == grpc.StatusCode.NOT_FOUND, details
        code, details = _stripe_call(running.port, pki.directory, "aws-1", None)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        contribute(link, seed=1)  # the session itself goes on untouched
        assert_round_exact(running, link, seed=1)
    finally:
        link.close()


def test_one_stream_stays_the_plain_path(serve, pki, relay_to):
    running = serve(max_chunk_bytes=CHUNK, streams=StreamsConfig(max_streams=1))
    relay = relay_to(running.port)
    link = open_link(relay.port, pki.directory)
    try:
        welcome = join(link)
        assert (welcome.stripe_token, welcome.streams) == (b"", 0)
        contribute(link, seed=1)
        assert_round_exact(running, link, seed=1)
        assert link.stripes is None and len(relay.connections) == 1
    finally:
        link.close()


def test_channels_that_dial_their_own_connection_each_get_one(serve, pki, relay_to):
    """Why a stripe dials with ``own_connection``: gRPC's core shares one TCP connection
    between channels to one target with the same arguments (its global subchannel pool),
    where they would share one congestion window. grpcio 1.85's Python channels default
    to a local pool (plain channels got their own connections here too); stripes ask for
    it explicitly, so they never depend on that default."""
    running = serve()
    relay = relay_to(running.port)
    config = AgentConfig(
        cloud="aws", name="aws-1", coordinator=f"localhost:{relay.port}", certs=pki.directory
    )
    channels = [open_channel(config, own_connection=True) for _ in range(STREAMS)]
    for channel in channels:
        grpc.channel_ready_future(channel).result(timeout=10)
    assert len(relay.connections) == STREAMS
    for channel in channels:
        channel.close()

"""Heartbeats carry the probe's loss counts (and stand in for it): they must not wait
behind a transfer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from skyfed.agent.link import Link
from skyfed.certs.authority import CertificateAuthority
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import federation_pb2_grpc as pb_grpc
from skyfed.proto.outbox import Outbox
from skyfed.wire import Chunk
from tests.conftest import credentials

CHUNKS = 40
CHUNK_BYTES = 1 << 20
READ_EVERY_S = 0.05


def chunk(seq: int) -> pb.AgentMessage:
    return pb.AgentMessage(chunk=pb.Chunk(seq=seq, data=bytes(8)))


def beat(sent_ns: int) -> pb.AgentMessage:
    return pb.AgentMessage(heartbeat=pb.Heartbeat(sent_ns=sent_ns))


def test_heartbeats_overtake_queued_messages_which_keep_their_order():
    outbox = Outbox()
    for message in (chunk(0), chunk(1), beat(1), chunk(2), beat(2)):
        outbox.put(message)
    outbox.close()
    sent = [(m.WhichOneof("body"), m.chunk.seq or m.heartbeat.sent_ns) for m in outbox]
    assert sent == [("heartbeat", 1), ("heartbeat", 2), ("chunk", 0), ("chunk", 1), ("chunk", 2)]


def test_a_closed_outbox_sends_what_was_queued_then_ends_and_drops_later_messages():
    outbox = Outbox()
    drained: list[pb.AgentMessage] = []
    reader = threading.Thread(target=lambda: drained.extend(outbox))
    reader.start()
    outbox.put(chunk(0))
    outbox.put(chunk(1))
    outbox.close()
    outbox.put(chunk(2))
    reader.join(timeout=5)
    assert not reader.is_alive()
    assert [m.chunk.seq for m in drained] == [0, 1]


class SlowReader(pb_grpc.FederationServicer):
    """A peer behind a slow link: takes a chunk per ``READ_EVERY_S`` (a heartbeat's few bytes
    at once), so flow control holds the sender's chunks back as a 160 Mbit/s link would."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.done = threading.Event()

    def Session(self, request_iterator, context):  # noqa: N802, ANN001, ANN201
        for message in request_iterator:
            self.kinds.append(message.WhichOneof("body"))
            if self.kinds.count("chunk") == CHUNKS:
                self.done.set()
                break
            if self.kinds[-1] == "chunk":
                time.sleep(READ_EVERY_S)
        return iter(())


@pytest.fixture
def slow_reader(pki: CertificateAuthority) -> Iterator[tuple[SlowReader, int]]:
    servicer = SlowReader()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[("grpc.max_receive_message_length", 2 * CHUNK_BYTES)],
    )
    pb_grpc.add_FederationServicer_to_server(servicer, server)
    certs = pki.directory
    creds = grpc.ssl_server_credentials(
        [((certs / "coordinator.key").read_bytes(), (certs / "coordinator.crt").read_bytes())],
        root_certificates=(certs / "ca.crt").read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    yield servicer, port
    server.stop(grace=None)


def test_agent_heartbeats_are_not_held_behind_a_gradient_upload(pki, slow_reader):
    """40 MB of chunks queued before the first heartbeat, read at 20 per second: queued in
    order, every heartbeat would arrive after the last chunk, 2 s late."""
    servicer, port = slow_reader
    options = [("grpc.max_send_message_length", 2 * CHUNK_BYTES)]
    channel = grpc.secure_channel(
        f"localhost:{port}", credentials(pki.directory, "aws-1"), options=options
    )
    link = Link(channel)
    try:
        for seq in range(CHUNKS):
            link.send(Chunk(0, 0, 0, None, "", seq, 0, 1, bytes(CHUNK_BYTES), 0))
        link.start_heartbeats(READ_EVERY_S)
        assert servicer.done.wait(timeout=30), "the upload did not finish"
    finally:
        link.close()
        channel.close()
    kinds = servicer.kinds
    assert "heartbeat" in kinds, "no heartbeat arrived during the upload"
    chunks_before_first_beat = kinds[: kinds.index("heartbeat")].count("chunk")
    # What gRPC and the socket already hold when the first heartbeat is queued still goes
    # first (a few MB on loopback), and on a loaded host the heartbeat thread may wake a
    # few reads late (22 of 40 seen at a load of 8 on 2 cores); queued in order it would
    # come after all 40.
    assert chunks_before_first_beat <= 3 * CHUNKS // 4, kinds
    assert kinds.count("heartbeat") >= 5, kinds

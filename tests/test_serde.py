"""Every protocol message and the status survive the trip through protobuf unchanged."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from skyfed.compression.monitor import Window
from skyfed.errors import ProtocolError
from skyfed.fingerprint import TensorInfo
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import serde
from skyfed.proto.chunks import cut
from skyfed.status import AgentStatus, RoundStats, Status
from skyfed.wire import (
    MAX_LOCAL_STEPS,
    Announce,
    Chunk,
    Heartbeat,
    Hello,
    Payload,
    ProbeOffer,
    Receipt,
    RoundEnd,
    WeightsEnd,
    Welcome,
    check_agent_message,
)

WELCOME = dict(
    round=4,
    weights_follow=True,
    codec="topk",
    codec_params='{"density": 0.5}',
    max_chunk_bytes=1 << 20,
    heartbeat_ms=500,
    identity="spiffe://skyfed/aws/aws-1",
    exchange="delta",
    sgd_lr=0.25,
    sgd_momentum=0.5,
)


@pytest.mark.parametrize(
    "message",
    [
        Welcome(**WELCOME, probe=ProbeOffer(5000, b"k" * 32, b"i" * 8, 50)),
        Welcome(**WELCOME),
        Chunk(1, 2, 3, (0, 8, 16), "fp16", 4, 0, 2, b"\x00\x01", 12345),
        Chunk(2, 0, 0, None, "fp32", 0, 0, 1, b"", 0),
        Receipt(3, False, 10, "round 3 closed"),
        RoundEnd(1, 7, "ab" * 32, 3, 0.5, "ecsgd", '{"bits": 2}', True),
        WeightsEnd(-1, 9, "cd" * 32, False),
        Heartbeat(10, 20, 1.5, 7, 1),
    ],
)
def test_coordinator_messages_survive_protobuf(message):
    wire = serde.coordinator_message_to_proto(message)
    assert serde.coordinator_message_from_proto(wire) == message


@pytest.mark.parametrize(
    "message",
    [
        Hello(
            "aws",
            "aws-1",
            "chargpt",
            [TensorInfo("w", (4, 2), "float32")],
            2,
            ("fp32", "topk"),
            -1,
            "ef" * 32,
            ("delta", "gradient"),
        ),
        Announce(5, 12, 64, 2.5, 0.125, 4096),
        Heartbeat(sent_ns=99, rtt_ms=3.0, probes_settled=4, probes_lost=2),
        Chunk(0, 5, 1, None, "topk", 0, 0, 1, b"x", 1),
    ],
)
def test_agent_messages_survive_protobuf(message):
    assert serde.agent_message_from_proto(serde.agent_message_to_proto(message)) == message


def test_status_survives_its_json_file():
    window = Window(0.5, 12.0, 1.0, 10, 1, 80.0)
    agent = AgentStatus(
        "aws", "aws-1", "idle", 3, "fp16", 12.0, 100, 200, 9.5, 1, 0, 0.5, 1.0, 80.0, [window]
    )
    stats = RoundStats(3, duration_s=1.5, train_s=1.0, contributors=2, mean_loss=2.5)
    status = Status(4, [agent], "ab" * 32, 30.0, [stats], False, "gradient")
    assert serde.status_from_json(serde.status_to_json(status)) == status


def test_a_message_serialized_once_is_numbered_per_session_without_changing_it():
    chunk = Chunk(
        kind=1,
        round=3,
        tensor=2,
        shard=None,
        codec="fp16",
        seq=7,
        part=0,
        parts=1,
        data=b"\x01\x02",
        crc32=9,
    )
    shared = serde.serialized_chunk(chunk)
    assert shared.body == "chunk" and serde.wire_size(shared) == len(shared.data)
    numbered = serde.numbered(shared, 41)
    parsed = pb.CoordinatorMessage.FromString(serde.coordinator_message_bytes(numbered))
    assert parsed.order == 41 and serde.coordinator_message_from_proto(parsed) == chunk
    plain = pb.CoordinatorMessage.FromString(serde.coordinator_message_bytes(shared))
    assert plain.order == 0 and serde.coordinator_message_from_proto(plain) == chunk


def test_hello_of_an_agent_from_before_local_steps_reads_as_0_and_a_huge_one_is_refused():
    old = pb.AgentMessage(hello=pb.Hello(cloud="aws", name="aws-1", last_round=-1))
    hello = serde.agent_message_from_proto(old)
    assert isinstance(hello, Hello) and hello.local_steps == 0
    assert check_agent_message(hello) is hello
    huge = pb.AgentMessage(
        hello=pb.Hello(cloud="aws", name="aws-1", local_steps=MAX_LOCAL_STEPS + 1)
    )
    with pytest.raises(ProtocolError, match="hello.local_steps"):
        check_agent_message(serde.agent_message_from_proto(huge))


def test_hello_carries_the_agents_congestion_control_and_an_overlong_one_is_refused():
    said = pb.AgentMessage(hello=pb.Hello(cloud="aws", name="aws-1", congestion_control="bbr"))
    hello = serde.agent_message_from_proto(said)
    assert isinstance(hello, Hello) and hello.congestion_control == "bbr"
    assert serde.agent_message_to_proto(hello).hello.congestion_control == "bbr"
    old = serde.agent_message_from_proto(pb.AgentMessage(hello=pb.Hello(cloud="aws")))
    assert isinstance(old, Hello) and old.congestion_control == ""  # an agent from before
    long = pb.AgentMessage(hello=pb.Hello(cloud="aws", name="aws-1", congestion_control="b" * 33))
    with pytest.raises(ProtocolError, match="hello.congestion_control"):
        check_agent_message(serde.agent_message_from_proto(long))


def _chunks() -> list[Chunk]:
    """Chunks with every field at zero, small, at a varint's boundaries and at its limits."""
    out = []
    for i, (round_, tensor, shard, codec, data, crc) in enumerate(
        [
            (0, 0, None, "", b"", 0),
            (3, 2, None, "fp16", b"\x01\x02", 9),
            (127, 128, (0, 0, 0), "topk", bytes(300), 2**32 - 1),
            (2**40, 2**32 - 1, (1, 2**40, 2**33), "topk:density=0.01", bytes(range(256)) * 9, 1),
            (-1, 5, (2, 5000, 7), "ecsgd", b"\xff" * 70_000, 12345),
        ]
    ):
        for kind, seq, part, parts in [(0, 0, 0, 0), (1, 2**31, 3, 200), (2, 127, 1, 2)]:
            out.append(Chunk(kind, round_, tensor, shard, codec, seq + i, part, parts, data, crc))
    return out


@pytest.mark.parametrize("chunk", _chunks())
def test_a_chunk_serialized_without_a_message_is_protobufs_bytes(chunk: Chunk) -> None:
    coordinator = serde.serialized_chunk(chunk)
    assert coordinator.body == "chunk"
    assert coordinator.data == serde.coordinator_message_to_proto(chunk).SerializeToString()
    agent = serde.serialized_agent_chunk(chunk)
    assert agent.data == serde.agent_message_to_proto(chunk).SerializeToString()
    parsed = serde.parse(pb.AgentMessage, serde.agent_message_bytes(agent))
    assert serde.agent_message_from_proto(parsed) == chunk


@pytest.mark.parametrize("chunk", _chunks())
def test_a_chunk_over_a_view_of_its_payload_serializes_as_one_over_bytes(chunk: Chunk) -> None:
    viewed = replace(chunk, data=memoryview(bytearray(chunk.data)))
    for lazy, eager, message in [
        (serde.serialized_chunk(viewed), serde.serialized_chunk(chunk), pb.CoordinatorMessage),
        (
            serde.serialized_agent_chunk(viewed),
            serde.serialized_agent_chunk(chunk),
            pb.AgentMessage,
        ),
    ]:
        assert lazy.data == eager.data and serde.wire_size(lazy) == len(eager.data)
        numbered = serde.numbered(lazy, 2**40 + 3)
        parsed = message.FromString(serde.coordinator_message_bytes(numbered))
        assert parsed.order == 2**40 + 3
        assert serde.wire_size(numbered) == len(numbered.data)
    parsed = pb.CoordinatorMessage.FromString(serde.serialized_chunk(viewed).data)
    assert serde.coordinator_message_from_proto(parsed) == chunk


def test_a_view_serialized_lazily_sends_what_its_memory_holds_when_sent():
    memory = bytearray(b"abcd")
    chunk = Chunk(1, 0, 0, None, "fp32", 0, 0, 1, memoryview(memory), 0)  # type: ignore[arg-type]
    shared = serde.serialized_chunk(chunk)
    assert pb.CoordinatorMessage.FromString(shared.data).chunk.data == b"abcd"
    memory[:] = b"wxyz"  # which is why the payload pool must not lend it while it is queued
    assert pb.CoordinatorMessage.FromString(shared.data).chunk.data == b"wxyz"


@pytest.mark.parametrize("size", [0, 1, 4096, 4097, 3 * 4096])
def test_chunks_cut_as_views_of_a_payload_are_the_chunks_cut_as_copies(size: int) -> None:
    data = bytes(i * 7 % 251 for i in range(size))
    memory = memoryview(np.frombuffer(data, dtype=np.uint8).copy())
    copies = list(cut(Payload(3, (0, 8, 9), "fp16", data), **CUT))
    views = list(cut(Payload(3, (0, 8, 9), "fp16", memory), views=True, **CUT))  # type: ignore[arg-type]
    assert all(isinstance(c.data, memoryview) for c in views)
    assert [replace(c, data=bytes(c.data)) for c in views] == copies
    sent = [serde.serialized_chunk(c).data for c in views]
    assert sent == [serde.coordinator_message_to_proto(c).SerializeToString() for c in copies]


CUT = dict(kind=1, round=5, first_seq=11, max_chunk_bytes=4096)


def _protobufs_reading(data: bytes) -> tuple[int, object] | str:
    """What the reader made of ``data`` before the direct read: (order, message), or the
    error's kind."""
    try:
        m = serde.parse(pb.AgentMessage, data)
        return m.order, serde.agent_message_from_proto(m)
    except ProtocolError as exc:
        return f"refused: {type(exc).__name__}"


@pytest.mark.parametrize("chunk", _chunks())
def test_an_agents_chunk_read_without_protobuf_is_protobufs_chunk_its_data_a_view(chunk) -> None:
    for message in (
        serde.serialized_agent_chunk(chunk),
        serde.numbered(serde.serialized_agent_chunk(chunk), 7),
    ):
        data = serde.agent_message_bytes(message)
        order, ours = serde.agent_chunk_from_bytes(data)
        assert (order, ours) == _protobufs_reading(data)
        if len(chunk.data):
            assert isinstance(ours.data, memoryview) and ours.data.obj is data  # no copy


def test_what_the_direct_read_takes_protobuf_reads_the_same_and_the_rest_goes_to_protobuf():
    """Mutated, truncated, reordered, repeated and foreign messages: the direct read
    either declines (None: protobuf parses it, and alone says what is wrong) or gives
    exactly protobuf's chunk and order, and refuses (ProtocolError) only what the
    checks after protobuf refuse too."""
    rng = np.random.default_rng(21)
    seeds = [serde.agent_message_bytes(serde.serialized_agent_chunk(c)) for c in _chunks()[:9]]
    seeds += [
        pb.AgentMessage(chunk=pb.Chunk(round=3, data=b"ab"), order=5).SerializeToString(),
        pb.AgentMessage(order=2, chunk=pb.Chunk(codec="fp16")).SerializeToString()[::-1],
        pb.AgentMessage(heartbeat=pb.Heartbeat(sent_ns=3)).SerializeToString(),
        pb.AgentMessage(chunk=pb.Chunk(kind=7, round=2**60)).SerializeToString(),
        b"",
    ]
    taken = declined = 0
    for seed in seeds:
        for _ in range(300):
            data = bytearray(seed)
            what = rng.integers(4)
            if what == 0 and data:  # flip a byte
                data[rng.integers(len(data))] = rng.integers(256)
            elif what == 1 and data:  # cut it short
                data = data[: rng.integers(len(data))]
            elif what == 2:  # a field more (a repeat, an unknown one, another order)
                data += bytes(rng.integers(256, size=rng.integers(1, 6)).tolist())
            else:  # a chunk's field written twice (the merge protobuf reads)
                data = data + data
            data = bytes(data)
            try:
                fast = serde.agent_chunk_from_bytes(data)
            except ProtocolError:
                assert str(_protobufs_reading(data)).startswith("refused")
                continue
            if fast is None:
                declined += 1
                continue
            taken += 1
            assert fast == _protobufs_reading(data)
    assert taken > 100 and declined > 100

"""Every conversion between protobuf messages and our own objects, in one place.

The rest of skyfed works on the dataclasses of ``skyfed/wire.py`` and
``skyfed/status.py``; the servicer, the agent's link and the admin client call these
at the stream. Our field names are the messages' own, so most conversions copy by name
(:func:`_to_proto`, :func:`_from_proto`) and say only what differs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from skyfed.compression.monitor import Window
from skyfed.errors import ProtocolError
from skyfed.fingerprint import TensorInfo
from skyfed.proto import federation_pb2 as pb
from skyfed.status import (
    AgentStatus,
    Efficiency,
    Failover,
    ReplicaInfo,
    ReplicaSet,
    RoundStats,
    Status,
)
from skyfed.wire import (
    AgentMessage,
    Announce,
    Chunk,
    ContributionEnd,
    CoordinatorMessage,
    ExchangeTiming,
    Following,
    Forward,
    Heartbeat,
    Hello,
    LeaderMessage,
    Leave,
    ProbeOffer,
    Receipt,
    ReplicaAck,
    ReplicaHello,
    ReplicaMessage,
    RoundClose,
    RoundEnd,
    ShardCoords,
    SnapshotEnd,
    WeightsEnd,
    Welcome,
    check_agent_message,
    check_coordinator_message,
    check_replica_message,
)

LEADER_METADATA = "skyfed-leader"
"""Trailing metadata of a standby coordinator replica's refusal: the leader's HOST:PORT."""


def _to_proto(message: type[Message], obj: Any, **differ: Any) -> Any:
    """``message`` with every field of ``obj`` it shares by name; ``differ`` overrides."""
    known = message.DESCRIPTOR.fields_by_name
    values = {f.name: getattr(obj, f.name) for f in fields(obj) if f.name in known}
    return message(**{**values, **differ})


def _from_proto(cls: Any, message: Message, **differ: Any) -> Any:
    """A ``cls`` from every field of ``message`` it shares by name; ``differ`` overrides."""
    known = message.DESCRIPTOR.fields_by_name
    shared = [f.name for f in fields(cls) if f.name in known and f.name not in differ]
    return cls(**{n: getattr(message, n) for n in shared}, **differ)


def specs_to_proto(spec: Sequence[TensorInfo]) -> list[pb.TensorSpec]:
    return [pb.TensorSpec(name=t.name, shape=list(t.shape), dtype=t.dtype) for t in spec]


def specs_from_proto(specs: Sequence[pb.TensorSpec]) -> list[TensorInfo]:
    return [TensorInfo(s.name, tuple(int(d) for d in s.shape), s.dtype) for s in specs]


def shard_to_proto(shard: ShardCoords) -> pb.Shard | None:
    return None if shard is None else pb.Shard(dim=shard[0], offset=shard[1], length=shard[2])


def shard_from_proto(chunk: pb.Chunk) -> ShardCoords:
    if not chunk.HasField("shard"):
        return None
    return (chunk.shard.dim, chunk.shard.offset, chunk.shard.length)


def chunk_to_proto(c: Chunk) -> pb.Chunk:
    return _to_proto(pb.Chunk, c, shard=shard_to_proto(c.shard))


def chunk_from_proto(c: pb.Chunk) -> Chunk:
    return _from_proto(Chunk, c, shard=shard_from_proto(c))


# ---- the session stream --------------------------------------------------------------------


def agent_message_to_proto(m: AgentMessage) -> pb.AgentMessage:
    if isinstance(m, Chunk):
        return pb.AgentMessage(chunk=chunk_to_proto(m))
    if isinstance(m, Heartbeat):
        return pb.AgentMessage(heartbeat=_to_proto(pb.Heartbeat, m))
    if isinstance(m, Announce):
        timing = None if m.timing is None else _to_proto(pb.ExchangeTiming, m.timing)
        return pb.AgentMessage(contribution=_to_proto(pb.Contribution, m, timing=timing))
    if isinstance(m, ContributionEnd):
        return pb.AgentMessage(contribution_end=_to_proto(pb.ContributionEnd, m))
    if isinstance(m, Leave):
        return pb.AgentMessage(leave=_to_proto(pb.Leave, m))
    return pb.AgentMessage(hello=_to_proto(pb.Hello, m, tensors=specs_to_proto(m.tensors)))


def parse(message: type[Message], data: bytes) -> Any:
    """``message`` parsed from ``data``, or ProtocolError saying why not."""
    try:
        return message.FromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"{len(data)} bytes are no {message.__name__}: {exc}") from exc


def agent_message_from_proto(m: pb.AgentMessage) -> AgentMessage | None:
    """Our message, bounds checked (``skyfed.wire.check_agent_message``), or None for an
    empty or unknown body."""
    message = _agent_message_from_proto(m)
    return None if message is None else check_agent_message(message)


def _agent_message_from_proto(m: pb.AgentMessage) -> AgentMessage | None:
    kind = m.WhichOneof("body")
    if kind == "chunk":
        return chunk_from_proto(m.chunk)
    if kind == "heartbeat":
        return _from_proto(Heartbeat, m.heartbeat)
    if kind == "contribution":
        c = m.contribution
        timing = _from_proto(ExchangeTiming, c.timing) if c.HasField("timing") else None
        loss = c.loss if c.HasField("loss") else None
        return _from_proto(Announce, c, timing=timing, loss=loss, metrics=dict(c.metrics))
    if kind == "contribution_end":
        return _from_proto(ContributionEnd, m.contribution_end)
    if kind == "leave":
        return _from_proto(Leave, m.leave)
    if kind == "hello":
        h = m.hello
        return _from_proto(
            Hello,
            h,
            tensors=specs_from_proto(h.tensors),
            codecs=tuple(h.codecs),
            exchanges=tuple(h.exchanges),
        )
    return None


def _welcome_to_proto(w: Welcome) -> pb.Welcome:
    out = _to_proto(pb.Welcome, w)
    if w.probe is not None:
        out.probe_port, out.probe_key, out.probe_id = w.probe.port, w.probe.key, w.probe.probe_id
        out.probe_interval_ms = w.probe.interval_ms
    return out


def _welcome_from_proto(w: pb.Welcome) -> Welcome:
    probe = None
    if w.probe_port:
        probe = ProbeOffer(w.probe_port, w.probe_key, w.probe_id, w.probe_interval_ms)
    return _from_proto(Welcome, w, probe=probe)


# Our coordinator messages, the ``CoordinatorMessage.body`` field each travels in, its type.
_BODIES: dict[type, tuple[str, type[Message]]] = {
    Receipt: ("receipt", pb.Receipt),
    RoundEnd: ("round_end", pb.RoundEnd),
    WeightsEnd: ("weights_end", pb.WeightsEnd),
    Heartbeat: ("heartbeat", pb.Heartbeat),
}


def coordinator_message_to_proto(m: CoordinatorMessage) -> pb.CoordinatorMessage:
    if isinstance(m, Chunk):
        return pb.CoordinatorMessage(chunk=chunk_to_proto(m))
    if isinstance(m, Welcome):
        return pb.CoordinatorMessage(welcome=_welcome_to_proto(m))
    body, inner = _BODIES[type(m)]
    return pb.CoordinatorMessage(**{body: _to_proto(inner, m)})


def coordinator_message_from_proto(m: pb.CoordinatorMessage) -> CoordinatorMessage | None:
    """Our message, its strings checked (``skyfed.wire.check_coordinator_message``), or
    None for an empty or unknown body (a newer coordinator's)."""
    message = _coordinator_message_from_proto(m)
    return None if message is None else check_coordinator_message(message)


def _coordinator_message_from_proto(m: pb.CoordinatorMessage) -> CoordinatorMessage | None:
    kind = m.WhichOneof("body")
    if kind == "chunk":
        return chunk_from_proto(m.chunk)
    if kind == "welcome":
        return _welcome_from_proto(m.welcome)
    for cls, (body, _) in _BODIES.items():
        if body == kind:
            return _from_proto(cls, getattr(m, body))
    return None


# ---- the replicas' stream (docs/failover.md) -----------------------------------------------

_REPLICA_BODIES: dict[type, tuple[str, type[Message]]] = {
    ReplicaHello: ("hello", pb.ReplicaHello),
    ReplicaAck: ("ack", pb.ReplicaAck),
}
_LEADER_BODIES: dict[type, tuple[str, type[Message]]] = {
    Following: ("following", pb.Following),
    Forward: ("forward", pb.Forward),
    RoundClose: ("round_close", pb.RoundClose),
    SnapshotEnd: ("snapshot_end", pb.SnapshotEnd),
}


def replica_message_to_proto(m: ReplicaMessage) -> pb.ReplicaMessage:
    body, inner = _REPLICA_BODIES[type(m)]
    return pb.ReplicaMessage(**{body: _to_proto(inner, m)})


def replica_message_from_bytes(data: bytes) -> ReplicaMessage:
    """What a standby sent, bounds checked; ProtocolError for anything else."""
    m = parse(pb.ReplicaMessage, data)
    kind = m.WhichOneof("body")
    for cls, (body, _) in _REPLICA_BODIES.items():
        if body == kind:
            message = _from_proto(cls, getattr(m, body))
            check_replica_message(message)
            return message
    raise ProtocolError("an empty or unknown replica message")


def leader_message_to_proto(m: LeaderMessage) -> pb.LeaderMessage:
    if isinstance(m, Chunk):
        return pb.LeaderMessage(chunk=chunk_to_proto(m))
    body, inner = _LEADER_BODIES[type(m)]
    return pb.LeaderMessage(**{body: _to_proto(inner, m)})


def leader_message_from_proto(m: pb.LeaderMessage) -> LeaderMessage:
    """What the leader sent, bounds checked; ProtocolError for an empty or unknown body."""
    kind = m.WhichOneof("body")
    message: LeaderMessage | None = None
    if kind == "chunk":
        message = chunk_from_proto(m.chunk)
    elif kind == "round_close":
        rc = m.round_close
        message = _from_proto(RoundClose, rc, contributions=tuple(rc.contributions))
    elif kind == "snapshot_end":
        message = _from_proto(SnapshotEnd, m.snapshot_end, norms=tuple(m.snapshot_end.norms))
    else:
        for cls, (body, _) in _LEADER_BODIES.items():
            if body == kind:
                message = _from_proto(cls, getattr(m, body))
    if message is None:
        raise ProtocolError("an empty or unknown message from the leader")
    check_replica_message(message)
    return message


def leader_message_bytes(m: pb.LeaderMessage | Serialized) -> bytes:
    """What the leader's ``Replicate`` stream sends (its response serializer)."""
    return m.data if isinstance(m, Serialized) else m.SerializeToString()


def replica_message_bytes(m: pb.ReplicaMessage) -> bytes:
    return m.SerializeToString()


def replicate_stream(channel: grpc.Channel) -> grpc.StreamStreamMultiCallable:
    """The ``Replicate`` call as a standby makes it."""
    return channel.stream_stream(
        f"/{_FEDERATION}/Replicate",
        request_serializer=replica_message_bytes,
        response_deserializer=pb.LeaderMessage.FromString,
    )


@dataclass(frozen=True, slots=True)
class Serialized:
    """A message serialized once, queued as is on every session of a broadcast: each
    aggregate chunk is converted and serialized one time, not once per agent (and no
    shared message is stamped by several sessions' senders at once).

    Its bytes are ``parts`` in order. A broadcast chunk's parts are its header, a view of
    the pooled payload's memory and its crc32, joined only when a session's sender asks
    for :attr:`data` (docs/scale.md, Streams): the queue then holds the payload's own
    memory (``coordinator/payload_pool.py``, which lends it again only once no queued chunk
    refers to it), not a copy of every chunk in new memory, for one short-lived 1 MiB
    copy per session and chunk.
    """

    parts: tuple[bytes | memoryview, ...]
    body: str
    """The message's ``body`` field (how an outbox routes it)."""

    @property
    def data(self) -> bytes:
        """The message's bytes (one part that is ``bytes`` is returned as is, not copied)."""
        return b"".join(self.parts)

    @property
    def size(self) -> int:
        """How many bytes :attr:`data` holds, without joining them."""
        return sum(len(p) for p in self.parts)


# ---- chunks, serialized without a message --------------------------------------------------
# Building a protobuf message around 1 MiB of data and serializing it costs ~0.9 CPU-ms
# per MiB here (upb's arena grows into fresh pages for every message), 30x a copy: the
# chunks of a round (1.2 GB at 100M parameters, both ends) are written as protobuf's own
# wire format instead, the header's few fields and then the data, joined when sent. Byte
# for byte what SerializeToString gives (tests/test_serde.py); parsed by protobuf as usual.

_AGENT_CHUNK_FIELD = pb.AgentMessage.DESCRIPTOR.fields_by_name["chunk"].number
_COORDINATOR_CHUNK_FIELD = pb.CoordinatorMessage.DESCRIPTOR.fields_by_name["chunk"].number
_ORDER_FIELD = pb.AgentMessage.DESCRIPTOR.fields_by_name["order"].number


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint; a negative int64 as its 64-bit two's complement."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _scalar(field: int, value: int) -> bytes:
    """A varint field; proto3 leaves a zero out."""
    return _key(field, 0) + _varint(value) if value else b""


def _delimited(field: int, data: bytes) -> bytes:
    """A length-delimited field's key and length (the data follows)."""
    return _key(field, 2) + _varint(len(data))


def _chunk_head(c: Chunk) -> bytes:
    """Every field of ``c``'s ``Chunk`` message but its data and crc32, in field order."""
    parts = [_scalar(1, c.kind), _scalar(2, c.round), _scalar(3, c.tensor)]
    if c.shard is not None:
        dim, offset, length = c.shard
        shard = _scalar(1, dim) + _scalar(2, offset) + _scalar(3, length)
        parts.append(_delimited(4, shard) + shard)
    if c.codec:
        codec = c.codec.encode()
        parts.append(_delimited(5, codec) + codec)
    parts += [_scalar(6, c.seq), _scalar(7, c.part), _scalar(8, c.parts)]
    return b"".join(parts)


def _chunk_parts(field: int, c: Chunk) -> Serialized:
    """The message's bytes as three parts: everything before the data, the data itself
    (not copied: a memoryview stays one), the crc32."""
    data = c.data
    head = _chunk_head(c) + (_delimited(9, data) if len(data) else b"")
    crc = _key(10, 5) + c.crc32.to_bytes(4, "little") if c.crc32 else b""
    tail = crc + _scalar(11, c.term)
    size = len(head) + len(data) + len(tail)
    return Serialized((_key(field, 2) + _varint(size) + head, data, tail), "chunk")


# A leader's chunk is the same bytes whether it goes to an agent or to a standby replica.
assert pb.LeaderMessage.DESCRIPTOR.fields_by_name["chunk"].number == _COORDINATOR_CHUNK_FIELD


def serialized_chunk(c: Chunk) -> Serialized:
    """``CoordinatorMessage{chunk: c}`` (equally ``LeaderMessage{chunk: c}``) serialized,
    without building the message; its data is joined in when a session sends it."""
    return _chunk_parts(_COORDINATOR_CHUNK_FIELD, c)


def serialized_agent_chunk(c: Chunk) -> Serialized:
    """``AgentMessage{chunk: c}`` serialized, without building the message; its data is
    joined in when the stream sends it."""
    return _chunk_parts(_AGENT_CHUNK_FIELD, c)


# ---- an agent's chunk, parsed without a message -----------------------------------------
# A reader parsing each 1 MiB uplink chunk with protobuf copies its data twice (the parse,
# then the ``data`` field), before the assembler's own copy (docs/scale.md). What agents
# send (``serialized_agent_chunk``, ``numbered`` on a stripe) is read here straight from
# the received bytes, its data a view of them. Strict: a field out of place, repeated,
# unknown or of another wire type, a value beyond its field's range, a length past the
# end: None, and protobuf parses it as before (so it alone says what a bad message is).

_U32, _U64 = (1 << 32) - 1, (1 << 64) - 1
# Chunk's fields: number -> (name, wire type, kind); varint kinds: "u32", "i64", "enum".
_CHUNK_FIELDS = {
    1: ("kind", 0, "enum"),
    2: ("round", 0, "i64"),
    3: ("tensor", 0, "u32"),
    4: ("shard", 2, "shard"),
    5: ("codec", 2, "str"),
    6: ("seq", 0, "u32"),
    7: ("part", 0, "u32"),
    8: ("parts", 0, "u32"),
    9: ("data", 2, "bytes"),
    10: ("crc32", 5, "fixed32"),
    11: ("term", 0, "i64"),
}
_SHARD_FIELDS = {1: "u32", 2: "i64", 3: "i64"}


def _read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """A varint at ``pos`` and the position after it; ValueError past ``end`` or 10 bytes."""
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value > _U64:
                raise ValueError("varint")
            return value, pos
        shift += 7


def _varint_value(value: int, kind: str) -> int:
    """A varint as its field's type reads it; ValueError where protobuf would read it
    otherwise than as the number itself (a wider value in a 32-bit field)."""
    if kind == "i64":
        return value - (1 << 64) if value >> 63 else value
    if kind == "enum":  # an int32: its negative values are sign-extended to 64 bits
        if value >> 31:
            raise ValueError("enum")
        return value
    if value > _U32:
        raise ValueError("uint32")
    return value


def _fields(
    buf: memoryview, pos: int, end: int, allowed: dict[int, int]
) -> Iterator[tuple[int, Any]]:
    """``(number, wire type, value or (start, stop))`` of each field in ``buf[pos:end]``,
    each number at most once, of its one wire type; ValueError otherwise."""
    seen = set()
    while pos < end:
        key, pos = _read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if allowed.get(number) != wire or number in seen:
            raise ValueError("field")
        seen.add(number)
        if wire == 0:
            value, pos = _read_varint(buf, pos, end)
            yield number, value
        elif wire == 2:
            length, pos = _read_varint(buf, pos, end)
            if length > end - pos:
                raise ValueError("length")
            yield number, (pos, pos + length)
            pos += length
        else:  # 5: fixed32
            if end - pos < 4:
                raise ValueError("fixed32")
            yield number, int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4


def agent_chunk_from_bytes(data: bytes) -> tuple[int, Chunk] | None:
    """``(order, chunk)`` for an ``AgentMessage`` that is one chunk (and maybe its
    ``order``), read without protobuf: the chunk's data is a view of ``data``, not a
    copy; bounds checked as :func:`agent_message_from_proto` checks them. None for any
    other message, or any encoding this reader does not take (protobuf then parses it)."""
    buf = memoryview(data)
    try:
        order, body = 0, None
        for number, value in _fields(buf, 0, len(buf), {_AGENT_CHUNK_FIELD: 2, _ORDER_FIELD: 0}):
            if number == _ORDER_FIELD:
                order = value  # uint64
            else:
                body = value
        if body is None:
            return None
        got: dict[str, Any] = {}
        wires = {n: w for n, (_, w, _) in _CHUNK_FIELDS.items()}
        for number, value in _fields(buf, body[0], body[1], wires):
            name, _, kind = _CHUNK_FIELDS[number]
            if kind == "bytes":
                got[name] = buf[value[0] : value[1]]
            elif kind == "str":
                got[name] = bytes(buf[value[0] : value[1]]).decode("utf-8")
            elif kind == "shard":
                shard = {1: 0, 2: 0, 3: 0}
                for n, v in _fields(buf, value[0], value[1], dict.fromkeys(_SHARD_FIELDS, 0)):
                    shard[n] = _varint_value(v, _SHARD_FIELDS[n])
                got[name] = (shard[1], shard[2], shard[3])
            elif kind == "fixed32":
                got[name] = value
            else:
                got[name] = _varint_value(value, kind)
    except (ValueError, UnicodeDecodeError):
        return None
    chunk = Chunk(
        kind=got.get("kind", 0),
        round=got.get("round", 0),
        tensor=got.get("tensor", 0),
        shard=got.get("shard"),
        codec=got.get("codec", ""),
        seq=got.get("seq", 0),
        part=got.get("part", 0),
        parts=got.get("parts", 0),
        data=got.get("data", b""),
        crc32=got.get("crc32", 0),
        term=got.get("term", 0),
    )
    check_agent_message(chunk)
    return order, chunk


def numbered(m: Serialized, position: int) -> Serialized:
    """``m`` with ``order = position``: a serialized message followed by another's bytes
    parses as their merge, and the later scalar wins (a part more, nothing copied)."""
    order = pb.CoordinatorMessage(order=position).SerializeToString()
    return Serialized((*m.parts, order), m.body)


def coordinator_message_bytes(m: pb.CoordinatorMessage | Serialized) -> bytes:
    """What the session streams send (their response serializer)."""
    return m.data if isinstance(m, Serialized) else m.SerializeToString()


def agent_message_bytes(m: pb.AgentMessage | Serialized) -> bytes:
    """What an agent's session and stripe streams send (their request serializer)."""
    return m.data if isinstance(m, Serialized) else m.SerializeToString()


_FEDERATION = pb.DESCRIPTOR.services_by_name["Federation"].full_name


def agent_stream(channel: grpc.Channel, method: str) -> grpc.StreamStreamMultiCallable:
    """The ``Session`` or ``Stripe`` call as an agent makes it: the generated stub's, but
    its requests may also be messages already serialized (an uplink's chunks)."""
    return channel.stream_stream(
        f"/{_FEDERATION}/{method}",
        request_serializer=agent_message_bytes,
        response_deserializer=pb.CoordinatorMessage.FromString,
    )


def wire_size(m: pb.CoordinatorMessage | pb.AgentMessage | Serialized) -> int:
    """The message's encoded bytes (what a session's byte counters add)."""
    return m.size if isinstance(m, Serialized) else m.ByteSize()


# ---- status --------------------------------------------------------------------------------


def status_to_proto(s: Status) -> pb.StatusReply:
    agents = [
        _to_proto(
            pb.AgentStatus,
            a,
            windows=[_to_proto(pb.LinkWindow, w) for w in a.windows],
            efficiency=None if a.efficiency is None else _to_proto(pb.LinkEfficiency, a.efficiency),
        )
        for a in s.agents
    ]
    rounds = [
        _to_proto(pb.RoundStat, r, links=[_to_proto(pb.LinkEfficiency, e) for e in r.links])
        for r in s.rounds
    ]
    replicas = None
    if s.replicas is not None:
        members = [_to_proto(pb.ReplicaInfo, m) for m in s.replicas.members]
        failovers = [_to_proto(pb.Failover, f) for f in s.replicas.failovers]
        replicas = _to_proto(pb.ReplicaSet, s.replicas, members=members, failovers=failovers)
    return _to_proto(pb.StatusReply, s, agents=agents, rounds=rounds, replicas=replicas)


def status_from_proto(s: pb.StatusReply) -> Status:
    agents = [
        _from_proto(
            AgentStatus,
            a,
            windows=[_from_proto(Window, w) for w in a.windows],
            efficiency=_from_proto(Efficiency, a.efficiency) if a.HasField("efficiency") else None,
            metrics=dict(a.metrics),
        )
        for a in s.agents
    ]
    rounds = [
        _from_proto(RoundStats, r, links=[_from_proto(Efficiency, e) for e in r.links])
        for r in s.rounds
    ]
    replicas = None
    if s.HasField("replicas"):
        members = [_from_proto(ReplicaInfo, m) for m in s.replicas.members]
        failovers = [_from_proto(Failover, f) for f in s.replicas.failovers]
        replicas = _from_proto(ReplicaSet, s.replicas, members=members, failovers=failovers)
    return _from_proto(
        Status,
        s,
        agents=agents,
        rounds=rounds,
        refusals=dict(s.refusals),
        eval_metrics=dict(s.eval_metrics),
        replicas=replicas,
    )


def status_to_json(s: Status) -> str:
    """The status file's text (and ``coordinator status --json``): the reply's JSON form,
    every field present, its 64-bit integers as numbers."""
    message = status_to_proto(s)
    data = json_format.MessageToDict(message, always_print_fields_with_no_presence=True)
    return json.dumps(_int64_as_numbers(message.DESCRIPTOR, data), indent=2)


_INT64 = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _int64_as_numbers(descriptor: Descriptor, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a message as ``MessageToDict`` gives it) with its 64-bit integers as
    numbers: proto3's JSON writes them as strings (for JavaScript's doubles), which every
    reader of a round or a byte count would have to convert; ``json_format.Parse`` takes
    either."""
    for field in descriptor.fields:
        if field.json_name not in data:
            continue
        value = data[field.json_name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            inner = field.message_type.fields_by_name["value"]
            if inner.type in _INT64:
                data[field.json_name] = {k: int(v) for k, v in value.items()}
        elif field.message_type is not None:
            items = value if isinstance(value, list) else [value]
            for item in items:
                _int64_as_numbers(field.message_type, item)
        elif field.type in _INT64:
            data[field.json_name] = (
                [int(v) for v in value] if isinstance(value, list) else int(value)
            )
    return data


def status_from_json(text: str) -> Status:
    return status_from_proto(json_format.Parse(text, pb.StatusReply()))

"""Every conversion between protobuf messages and our own objects, in one place.

The rest of skyfed works on the dataclasses of ``skyfed/wire.py`` and
``coordinator/status.py``; the servicer and the agent's link call these at the stream.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf import json_format

from skyfed.coordinator.status import AgentStatus, LinkWindow, RoundStats, Status
from skyfed.fingerprint import TensorInfo
from skyfed.proto import federation_pb2 as pb
from skyfed.wire import (
    AgentMessage,
    Announce,
    Chunk,
    CoordinatorMessage,
    Heartbeat,
    Hello,
    ProbeOffer,
    Receipt,
    RoundEnd,
    ShardCoords,
    WeightsEnd,
    Welcome,
)


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


# ---- chunks --------------------------------------------------------------------------------


def chunk_to_proto(c: Chunk) -> pb.Chunk:
    return pb.Chunk(
        kind=c.kind,
        round=c.round,
        tensor=c.tensor,
        shard=shard_to_proto(c.shard),
        codec=c.codec,
        seq=c.seq,
        part=c.part,
        parts=c.parts,
        data=c.data,
        crc32=c.crc32,
    )


def chunk_from_proto(c: pb.Chunk) -> Chunk:
    return Chunk(
        kind=c.kind,
        round=c.round,
        tensor=c.tensor,
        shard=shard_from_proto(c),
        codec=c.codec,
        seq=c.seq,
        part=c.part,
        parts=c.parts,
        data=c.data,
        crc32=c.crc32,
    )


# ---- agent messages ------------------------------------------------------------------------


def heartbeat_to_proto(h: Heartbeat) -> pb.Heartbeat:
    return pb.Heartbeat(
        sent_ns=h.sent_ns,
        echo_ns=h.echo_ns,
        rtt_ms=h.rtt_ms,
        probes_settled=h.probes_settled,
        probes_lost=h.probes_lost,
    )


def heartbeat_from_proto(h: pb.Heartbeat) -> Heartbeat:
    return Heartbeat(h.sent_ns, h.echo_ns, h.rtt_ms, h.probes_settled, h.probes_lost)


def agent_message_to_proto(m: AgentMessage) -> pb.AgentMessage:
    if isinstance(m, Chunk):
        return pb.AgentMessage(chunk=chunk_to_proto(m))
    if isinstance(m, Heartbeat):
        return pb.AgentMessage(heartbeat=heartbeat_to_proto(m))
    if isinstance(m, Announce):
        header = pb.Contribution(
            round=m.round,
            chunks=m.chunks,
            samples=m.samples,
            loss=m.loss,
            train_s=m.train_s,
            raw_bytes=m.raw_bytes,
        )
        return pb.AgentMessage(contribution=header)
    hello = pb.Hello(
        cloud=m.cloud,
        name=m.name,
        task=m.task,
        tensors=specs_to_proto(m.tensors),
        tp=m.tp,
        codecs=list(m.codecs),
        last_round=m.last_round,
        weights_digest=m.weights_digest,
        exchanges=list(m.exchanges),
    )
    return pb.AgentMessage(hello=hello)


def agent_message_from_proto(m: pb.AgentMessage) -> AgentMessage | None:
    """Our message, or None for an empty or unknown body."""
    kind = m.WhichOneof("body")
    if kind == "chunk":
        return chunk_from_proto(m.chunk)
    if kind == "heartbeat":
        return heartbeat_from_proto(m.heartbeat)
    if kind == "contribution":
        c = m.contribution
        return Announce(c.round, c.chunks, c.samples, c.loss, c.train_s, c.raw_bytes)
    if kind == "hello":
        h = m.hello
        return Hello(
            cloud=h.cloud,
            name=h.name,
            task=h.task,
            tensors=specs_from_proto(h.tensors),
            tp=h.tp,
            codecs=tuple(h.codecs),
            last_round=h.last_round,
            weights_digest=h.weights_digest,
            exchanges=tuple(h.exchanges),
        )
    return None


# ---- coordinator messages ------------------------------------------------------------------


def _welcome_to_proto(w: Welcome) -> pb.Welcome:
    out = pb.Welcome(
        round=w.round,
        weights_follow=w.weights_follow,
        codec=w.codec,
        codec_params=w.codec_params,
        max_chunk_bytes=w.max_chunk_bytes,
        heartbeat_ms=w.heartbeat_ms,
        identity=w.identity,
        exchange=w.exchange,
        sgd_lr=w.sgd_lr,
        sgd_momentum=w.sgd_momentum,
    )
    if w.probe is not None:
        out.probe_port, out.probe_key, out.probe_id = w.probe.port, w.probe.key, w.probe.probe_id
        out.probe_interval_ms = w.probe.interval_ms
    return out


def _welcome_from_proto(w: pb.Welcome) -> Welcome:
    probe = None
    if w.probe_port:
        probe = ProbeOffer(w.probe_port, w.probe_key, w.probe_id, w.probe_interval_ms)
    return Welcome(
        round=w.round,
        weights_follow=w.weights_follow,
        codec=w.codec,
        codec_params=w.codec_params,
        max_chunk_bytes=w.max_chunk_bytes,
        heartbeat_ms=w.heartbeat_ms,
        identity=w.identity,
        exchange=w.exchange,
        sgd_lr=w.sgd_lr,
        sgd_momentum=w.sgd_momentum,
        probe=probe,
    )


def coordinator_message_to_proto(m: CoordinatorMessage) -> pb.CoordinatorMessage:
    if isinstance(m, Chunk):
        return pb.CoordinatorMessage(chunk=chunk_to_proto(m))
    if isinstance(m, Heartbeat):
        return pb.CoordinatorMessage(heartbeat=heartbeat_to_proto(m))
    if isinstance(m, Receipt):
        receipt = pb.Receipt(round=m.round, accepted=m.accepted, code=m.code, message=m.message)
        return pb.CoordinatorMessage(receipt=receipt)
    if isinstance(m, RoundEnd):
        end = pb.RoundEnd(
            round=m.round,
            chunks=m.chunks,
            weights_digest=m.weights_digest,
            contributors=m.contributors,
            mean_loss=m.mean_loss,
            codec=m.codec,
            codec_params=m.codec_params,
            final=m.final,
        )
        return pb.CoordinatorMessage(round_end=end)
    if isinstance(m, WeightsEnd):
        weights_end = pb.WeightsEnd(
            round=m.round, chunks=m.chunks, weights_digest=m.weights_digest, final=m.final
        )
        return pb.CoordinatorMessage(weights_end=weights_end)
    return pb.CoordinatorMessage(welcome=_welcome_to_proto(m))


def coordinator_message_from_proto(m: pb.CoordinatorMessage) -> CoordinatorMessage | None:
    """Our message, or None for an empty or unknown body (a newer coordinator's)."""
    kind = m.WhichOneof("body")
    if kind == "chunk":
        return chunk_from_proto(m.chunk)
    if kind == "heartbeat":
        return heartbeat_from_proto(m.heartbeat)
    if kind == "receipt":
        r = m.receipt
        return Receipt(r.round, r.accepted, r.code, r.message)
    if kind == "round_end":
        e = m.round_end
        return RoundEnd(
            e.round,
            e.chunks,
            e.weights_digest,
            e.contributors,
            e.mean_loss,
            e.codec,
            e.codec_params,
            e.final,
        )
    if kind == "weights_end":
        e = m.weights_end
        return WeightsEnd(e.round, e.chunks, e.weights_digest, e.final)
    if kind == "welcome":
        return _welcome_from_proto(m.welcome)
    return None


def wire_size(m: pb.CoordinatorMessage | pb.AgentMessage) -> int:
    """The message's encoded bytes (what a session's byte counters add)."""
    return m.ByteSize()


# ---- status --------------------------------------------------------------------------------


def status_to_proto(s: Status) -> pb.StatusReply:
    agents = [
        pb.AgentStatus(
            cloud=a.cloud,
            name=a.name,
            state=a.state,
            last_round=a.last_round,
            codec=a.codec,
            rtt_ms=a.rtt_ms,
            bytes_up=a.bytes_up,
            bytes_down=a.bytes_down,
            connected_s=a.connected_s,
            codec_switches=a.codec_switches,
            refused=a.refused,
            loss_pct=a.loss_pct,
            jitter_ms=a.jitter_ms,
            goodput_mbit=a.goodput_mbit,
            windows=[
                pb.LinkWindow(
                    start_s=w.start_s,
                    rtt_ms=w.rtt_ms,
                    jitter_ms=w.jitter_ms,
                    probes=w.probes,
                    probes_lost=w.probes_lost,
                    goodput_mbit=w.goodput_mbit,
                )
                for w in a.windows
            ],
        )
        for a in s.agents
    ]
    rounds = [
        pb.RoundStat(
            round=r.round,
            duration_s=r.duration_s,
            train_s=r.train_s,
            contributors=r.contributors,
            mean_loss=r.mean_loss,
            bytes_up=r.bytes_up,
            bytes_down=r.bytes_down,
            raw_bytes_up=r.raw_bytes_up,
            raw_bytes_down=r.raw_bytes_down,
            downlink_codec=r.downlink_codec,
        )
        for r in s.rounds
    ]
    return pb.StatusReply(
        round=s.round,
        agents=agents,
        weights_digest=s.weights_digest,
        uptime_s=s.uptime_s,
        rounds=rounds,
        finished=s.finished,
        exchange=s.exchange,
    )


def status_from_proto(s: pb.StatusReply) -> Status:
    agents = [
        AgentStatus(
            cloud=a.cloud,
            name=a.name,
            state=a.state,
            last_round=a.last_round,
            codec=a.codec,
            rtt_ms=a.rtt_ms,
            bytes_up=a.bytes_up,
            bytes_down=a.bytes_down,
            connected_s=a.connected_s,
            codec_switches=a.codec_switches,
            refused=a.refused,
            loss_pct=a.loss_pct,
            jitter_ms=a.jitter_ms,
            goodput_mbit=a.goodput_mbit,
            windows=[
                LinkWindow(
                    w.start_s, w.rtt_ms, w.jitter_ms, w.probes, w.probes_lost, w.goodput_mbit
                )
                for w in a.windows
            ],
        )
        for a in s.agents
    ]
    rounds = [
        RoundStats(
            round=r.round,
            duration_s=r.duration_s,
            train_s=r.train_s,
            contributors=r.contributors,
            mean_loss=r.mean_loss,
            bytes_up=r.bytes_up,
            bytes_down=r.bytes_down,
            raw_bytes_up=r.raw_bytes_up,
            raw_bytes_down=r.raw_bytes_down,
            downlink_codec=r.downlink_codec,
        )
        for r in s.rounds
    ]
    return Status(
        round=s.round,
        agents=agents,
        weights_digest=s.weights_digest,
        uptime_s=s.uptime_s,
        rounds=rounds,
        finished=s.finished,
        exchange=s.exchange,
    )


def status_to_json(s: Status) -> str:
    """The status file's text: the reply's JSON form, every field present."""
    return json_format.MessageToJson(status_to_proto(s), always_print_fields_with_no_presence=True)


def status_from_json(text: str) -> Status:
    return status_from_proto(json_format.Parse(text, pb.StatusReply()))

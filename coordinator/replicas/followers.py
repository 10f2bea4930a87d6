"""The leader's side of state replication: the standbys that follow it (docs/failover.md).

A standby opens ``Replicate`` and says where its state stands. The leader attaches it at
once, under the federation's lock: a snapshot first if its state is not the leader's
(``Model.checkpoint``'s tensors as FP32 payloads, copied under the lock and sent off it),
then every payload the open round has staged so far, in the order they were staged. From
then on each payload is forwarded as it is staged, and each round's close as a
``RoundClose`` (the committed contributions, the downlink's codec, the local steps), which
the standby replays with the same ``Model`` and ``Round`` (``follow.py``): the same
weights, momentum, residual and clipping window, bit for bit.

Forwarded payloads are queued by reference, the bytes the aggregate holds, and cut into
chunks (views, no copy) on the stream's own thread, off the round's path. The round's end
waits in :meth:`Followers.release` for every attached standby's ack of the round, bounded
by ``ack_timeout_s``: one that does not ack in time, or acks other weights, is detached
and counts as behind. With none attached the leader releases alone. Then the release is
written to etcd under the leader's term (``guard``: a deposed leader's write fails, so it
releases nothing), and only then do agents get the round's end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from skyfed.certs.identity import replica_name
from skyfed.compression import make_codec
from skyfed.coordinator.checkpoint import section_digest
from skyfed.coordinator.status_codes import abort
from skyfed.errors import (
    FederationError,
    IdentityMismatchError,
    ModelMismatchError,
    NotLeaderError,
    ProtocolError,
)
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import serde
from skyfed.proto.chunks import cut
from skyfed.status import ReplicaInfo
from skyfed.wire import (
    ChunkKind,
    Following,
    Forward,
    Payload,
    ReplicaAck,
    ReplicaHello,
    RoundClose,
    SnapshotEnd,
)

if TYPE_CHECKING:
    from skyfed.coordinator.aggregate import Contribution
    from skyfed.coordinator.calls import Call
    from skyfed.coordinator.federation import Federation
    from skyfed.coordinator.model import Model
    from skyfed.coordinator.round import Round
    from skyfed.coordinator.service import Leadership

log = logging.getLogger(__name__)

MAX_FOLLOWERS = 8
"""Standbys one leader streams to at once (a federation runs two or three replicas)."""
KEEP_DIGESTS = 16
"""Released rounds whose digest a catching-up standby's ack is compared with."""

ReleaseGuard = Callable[[int, str], bool]
"""``guard(round, digest)``: record round ``round`` as released under this leader's term
(etcd, ``serve.py``); False once this replica no longer leads."""


class ReleaseRefused(RuntimeError):
    """A round was not released: this replica no longer leads (its term ended)."""


@dataclass(slots=True)
class _Forward:
    header: Forward
    payload: Payload


@dataclass(slots=True)
class _Snapshot:
    sections: list[tuple[ChunkKind, list[Payload]]]
    end: SnapshotEnd


class FollowerStream:
    """One standby's ``Replicate`` stream at the leader: what is queued for it and where
    its state stands."""

    def __init__(self, replica: str, peer: str, term: int, max_chunk_bytes: int) -> None:
        self.replica = replica
        self.peer = peer
        self.term = term
        self.max_chunk_bytes = max_chunk_bytes
        self.state = "catching-up"
        """catching-up until it acks a round the leader released with the same weights;
        following from then on: only then does a round's end wait for it."""
        self.round = -1
        """The last round its state holds, as its acks say (-1: before any)."""
        self.acked_digest = ""
        self.closed = False
        self.reason = ""
        """Why the leader ended the stream ("": it did not)."""
        self._items: deque[object] = deque()
        self._cond = threading.Condition()

    def put(self, item: object) -> None:
        with self._cond:
            if not self.closed:
                self._items.append(item)
                self._cond.notify()

    def close(self, reason: str = "") -> None:
        """End the stream at once; what is queued is dropped (the standby resyncs)."""
        with self._cond:
            if self.closed:
                return
            self.closed, self.reason = True, reason
            self._items.clear()
            self._cond.notify_all()

    def messages(self) -> Iterator[pb.LeaderMessage | serde.Serialized]:
        """What the stream sends, in order, until it is closed: forwarded payloads are cut
        into chunks here, on the stream's thread."""
        while True:
            with self._cond:
                while not self._items and not self.closed:
                    self._cond.wait()
                if self.closed:
                    return
                item = self._items.popleft()
            if isinstance(item, _Forward):
                yield serde.leader_message_to_proto(item.header)
                yield from self._chunks(item.payload, ChunkKind.GRADIENT, item.header.round)
            elif isinstance(item, _Snapshot):
                for kind, payloads in item.sections:
                    seq = 0
                    for payload in payloads:
                        for chunk in self._chunks(payload, kind, item.end.round, seq):
                            seq += 1
                            yield chunk
                yield serde.leader_message_to_proto(item.end)
            else:
                yield item  # type: ignore[misc]  # a message already made

    def _chunks(
        self, payload: Payload, kind: ChunkKind, round_: int, first_seq: int = 0
    ) -> Iterator[serde.Serialized]:
        for chunk in cut(
            payload,
            kind=kind,
            round=round_,
            first_seq=first_seq,
            max_chunk_bytes=self.max_chunk_bytes,
            views=True,
            term=self.term,
        ):
            yield serde.serialized_chunk(chunk)

    def chunks_of(self, payload: Payload) -> int:
        return max(1, -(-len(payload.data) // self.max_chunk_bytes))


@dataclass(slots=True)
class _Behind:
    """A standby the leader detached: the last round it held, and why it went."""

    round: int
    reason: str
    at: float = field(default_factory=time.monotonic)


class Followers:
    """Every standby following this leader (see the module docstring). Methods marked
    so are called with the federation's lock held; the rest take only this object's."""

    def __init__(self, term: int, ack_timeout_s: float, guard: ReleaseGuard | None) -> None:
        self.term = term
        self.ack_timeout_s = ack_timeout_s
        self.guard = guard
        self.released = -1
        """The last round released to the agents."""
        self.alone = True
        """The last round was released with no standby following."""
        self.fed: Federation | None = None
        self._streams: dict[str, FollowerStream] = {}
        self._expected: list[FollowerStream] = []
        """The streams the closing round waits for."""
        self._behind: dict[str, _Behind] = {}
        self._resnapshot: set[str] = set()
        """Standbys whose weights differed from the leader's: the next attach snapshots."""
        self._digests: dict[int, str] = {}
        """The weights' digest after each of the last rounds released."""
        self._cond = threading.Condition()

    def bind(self, fed: Federation) -> Followers:
        self.fed = fed
        with fed.cond:
            self.released = fed.model.round - 1
            self._digests[self.released] = fed.model.weights_digest
        return self

    # ---- with the federation's lock held ---------------------------------------------------

    def attach(self, stream: FollowerStream, hello: ReplicaHello) -> None:
        """Start ``stream`` (the federation's lock held): a snapshot if its state is not
        this leader's, the open round's staged payloads, then every later one."""
        assert self.fed is not None
        model, round_ = self.fed.model, self.fed.rounds.round
        if hello.spec_digest != model.spec_digest:
            raise ModelMismatchError(
                f"replica {hello.replica} trains model {hello.spec_digest}, this federation "
                f"{model.spec_digest}: give every replica the same task"
            )
        if hello.term > self.term:
            raise NotLeaderError(f"term {hello.term} is newer than this leader's {self.term}")
        behind = (hello.round, hello.weights_digest) != (model.round - 1, model.weights_digest)
        snapshot = hello.snapshot or behind or hello.replica in self._resnapshot
        with self._cond:
            if len(self._streams) >= MAX_FOLLOWERS and hello.replica not in self._streams:
                raise FederationError(f"this leader already streams to {MAX_FOLLOWERS} standbys")
            old = self._streams.get(hello.replica)
            if old is not None:
                old.close("replaced by a newer stream of the same replica")
            self._streams[hello.replica] = stream
            self._resnapshot.discard(hello.replica)
        stream.round = model.round - 1 if snapshot else hello.round
        stream.put(serde.leader_message_to_proto(Following(self.term, round_.number, snapshot)))
        if snapshot:
            stream.put(_snapshot(model, self.term, stream.chunks_of))
        for contribution, payload in round_.staged():
            stream.put(self._forward(round_, contribution, payload, stream))
        log.info(
            "[Coordinator.Replicate] replica=%s peer=%s round=%d snapshot=%s held=%d",
            stream.replica,
            stream.peer,
            round_.number,
            snapshot,
            hello.round,
        )

    def staged(self, round_: Round, contribution: Contribution, payload: Payload) -> None:
        """Forward a payload just staged to every standby (the federation's lock held)."""
        with self._cond:
            streams = [s for s in self._streams.values() if not s.closed]
        for stream in streams:
            stream.put(self._forward(round_, contribution, payload, stream))

    def _forward(
        self, round_: Round, contribution: Contribution, payload: Payload, stream: FollowerStream
    ) -> _Forward:
        header = Forward(
            term=self.term,
            round=round_.number,
            contribution=round_.contribution_number(contribution),
            key=contribution.key,
            samples=contribution.samples,
            chunks=stream.chunks_of(payload),
        )
        return _Forward(header, payload)

    def closing(self, round_: Round, codec: str, since: int, local_steps: int) -> None:
        """Round ``round_`` closes with ``codec`` (its run since round ``since``) and
        ``local_steps`` (the federation's lock held): every standby closes its own."""
        close = RoundClose(
            term=self.term,
            round=round_.number,
            codec=codec,
            codec_since=since,
            local_steps=local_steps,
            contributions=tuple(round_.committed_numbers()),
        )
        message = serde.leader_message_to_proto(close)
        with self._cond:
            streams = [s for s in self._streams.values() if not s.closed]
            self._expected = [s for s in streams if s.state == "following"]
        for stream in streams:
            stream.put(message)

    def release(self, number: int, digest: str) -> bool:
        """Wait until every following standby has acked round ``number`` with ``digest``
        (at most ``ack_timeout_s``; the federation's lock held), then record the release
        under this leader's term. False: this replica no longer leads (nothing may be
        released). A standby still catching up is not waited for."""
        started = time.monotonic()
        deadline = started + self.ack_timeout_s
        with self._cond:
            while True:
                waiting = [s for s in self._expected if not s.closed and s.round < number]
                left = deadline - time.monotonic()
                if not waiting or left <= 0:
                    break
                self._cond.wait(left)
            for stream in self._expected:
                self._judge(stream, number, digest)
            for stream in self._streams.values():  # caught up with this very round
                held = (stream.round, stream.acked_digest) == (number, digest)
                if stream.state == "catching-up" and held:
                    self._caught_up(stream)
            self.alone = not any(not s.closed for s in self._expected)
            followed = sum(not s.closed for s in self._expected)
            self._expected = []
        acked = time.monotonic()
        if self.guard is not None and not self.guard(number, digest):
            return False
        log.info(
            "[Coordinator.Release] round=%d standbys=%d ack_wait_ms=%.0f etcd_ms=%.0f",
            number,
            followed,
            (acked - started) * 1000,
            (time.monotonic() - acked) * 1000,
        )
        with self._cond:
            self.released = number
            self._digests[number] = digest
            for old in sorted(self._digests)[:-KEEP_DIGESTS]:
                del self._digests[old]
        return True

    def _judge(self, stream: FollowerStream, number: int, digest: str) -> None:
        """After round ``number``'s wait: ``stream`` follows, or is detached (this
        object's lock held)."""
        if stream.closed:
            return
        if stream.round < number:
            why = f"it did not acknowledge round {number} within {self.ack_timeout_s:g} s"
            self._detach(stream, why)
        elif stream.acked_digest != digest:
            self._resnapshot.add(stream.replica)
            why = f"its weights after round {number} differ from the leader's: snapshot"
            self._detach(stream, why)
        else:
            stream.state = "following"

    # ---- from the streams' threads ---------------------------------------------------------

    def acked(self, stream: FollowerStream, ack: ReplicaAck) -> None:
        if ack.term != self.term:
            raise ProtocolError(f"an ack of term {ack.term} on a stream of term {self.term}")
        with self._cond:
            stream.round, stream.acked_digest = ack.round, ack.weights_digest
            known = self._digests.get(ack.round)
            if stream.state == "catching-up" and known is not None:
                if known == ack.weights_digest:
                    self._caught_up(stream)
                else:
                    self._resnapshot.add(stream.replica)
                    why = f"its weights after round {ack.round} differ from the leader's"
                    self._detach(stream, why)
            self._cond.notify_all()

    def _caught_up(self, stream: FollowerStream) -> None:
        """``stream`` holds a released round: the next rounds' ends wait for it."""
        stream.state = "following"
        log.info(
            "[Coordinator.Replicate] replica=%s following from round %d",
            stream.replica,
            stream.round,
        )

    def detach(self, stream: FollowerStream, reason: str) -> None:
        with self._cond:
            self._detach(stream, reason)

    def _detach(self, stream: FollowerStream, reason: str) -> None:
        """End ``stream``; its replica counts as behind until it attaches again."""
        if self._streams.get(stream.replica) is stream:
            del self._streams[stream.replica]
            self._behind[stream.replica] = _Behind(stream.round, reason)
            log.warning("[Coordinator.Replicate] replica=%s behind: %s", stream.replica, reason)
        stream.close(reason)
        self._cond.notify_all()

    # ---- for status ------------------------------------------------------------------------

    def info(self, members: list[ReplicaInfo]) -> list[ReplicaInfo]:
        """``members`` (every replica with a live lease) with each one's state, round and
        lag as this leader sees it."""
        out = []
        with self._cond:
            for m in members:
                stream = self._streams.get(m.name)
                if stream is not None:
                    state, round_ = stream.state, stream.round
                elif m.name in self._behind:
                    state, round_ = "behind", self._behind[m.name].round
                else:
                    out.append(ReplicaInfo(m.name, m.address, "standby"))
                    continue
                lag = max(0, self.released - round_)
                out.append(ReplicaInfo(m.name, m.address, state, round_, lag))
        return out


def _snapshot(model: Model, term: int, chunks_of: Callable[[Payload], int]) -> _Snapshot:
    """The model's state after its last closed round, copied (FP32 payloads) while the
    caller holds the federation's lock: the next close changes the tensors in place."""
    ckpt = model.checkpoint()
    fp32 = make_codec("fp32")
    parts = [
        (ChunkKind.WEIGHTS, ckpt.weights),
        (ChunkKind.RESIDUAL, ckpt.downlink_residual or []),
        (ChunkKind.MOMENTUM, ckpt.outer_momentum or []),
    ]
    sections = [
        (kind, [Payload(i, None, "fp32", fp32.encode(t)) for i, t in enumerate(tensors)])
        for kind, tensors in parts
    ]
    run = model.downlink.run
    end = SnapshotEnd(
        term=term,
        round=ckpt.round,
        chunks=sum(chunks_of(p) for _, payloads in sections for p in payloads),
        weights_digest=model.weights_digest,
        residual_digest=_digest("residual", ckpt.downlink_residual),
        momentum_digest=_digest("outer", ckpt.outer_momentum),
        norms=tuple(ckpt.norms),
        codec=run.codec,
        codec_since=run.since,
    )
    return _Snapshot(sections, end)


def _digest(section: str, tensors: list | None) -> str:
    return section_digest(section, tensors) if tensors else ""


# ---- the servicer's half ---------------------------------------------------------------------


def serve_replicate(
    fed: Federation,
    call: Call,
    leadership: Leadership | None,
    requests: Iterator[bytes],
    context: grpc.ServicerContext,
) -> Iterator[pb.LeaderMessage | serde.Serialized]:
    """The ``Replicate`` call at a leader (``call``: identified, counted and its first
    message read by the call guard, ``coordinator/calls.py``): a coordinator replica's
    identity only, its hello checked and its stream attached; acks read on a thread of
    their own; revoked, it ends."""
    followers = fed.replication
    identity = call.identity
    try:
        if identity.role != "coordinator":
            raise IdentityMismatchError(f"{identity.uri} is not a coordinator replica")
        if followers is None or leadership is None:
            raise NotLeaderError("this coordinator runs alone: it has no replicas to follow it")
        leadership.check()
        hello = serde.replica_message_from_bytes(next(requests))
        if not isinstance(hello, ReplicaHello):
            raise ProtocolError("a replica's first message must be its hello")
        if identity.name != replica_name(hello.replica):
            raise IdentityMismatchError(
                f"hello names replica {hello.replica!r} but the certificate is {identity.uri}"
            )
        stream = FollowerStream(
            hello.replica, context.peer(), followers.term, fed.config.transport.max_chunk_bytes
        )
        with fed.cond:
            followers.attach(stream, hello)
    except FederationError as exc:
        log.warning("[Federation.Replicate] refused peer=%s: %s", context.peer(), exc)
        abort(context, exc)
    call.ended_by(lambda reason: followers.detach(stream, reason))
    context.add_callback(lambda: followers.detach(stream, "its stream ended"))
    reader = threading.Thread(
        target=_read_acks, args=(followers, stream, requests), name="replica-acks", daemon=True
    )
    reader.start()
    yield from stream.messages()
    if stream.reason:
        context.abort(grpc.StatusCode.ABORTED, stream.reason)


def _read_acks(followers: Followers, stream: FollowerStream, requests: Iterator[bytes]) -> None:
    try:
        for data in requests:
            message = serde.replica_message_from_bytes(data)
            if not isinstance(message, ReplicaAck):
                raise ProtocolError("a second replica hello on one stream")
            followers.acked(stream, message)
    except FederationError as exc:
        followers.detach(stream, str(exc))
        return
    except grpc.RpcError:
        pass
    followers.detach(stream, "its stream ended")

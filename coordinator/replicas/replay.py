"""A standby replica's copy of the federation's state, kept in step with the leader's.

The standby dials the leader (the address etcd names) with its own coordinator
certificate and opens ``Replicate`` (``followers.py`` is the leader's side). It replays
the leader's rounds with the same ``Model`` and ``Round``: each forwarded payload is
received into its own open round, checked as the leader checked it; each ``RoundClose``
commits exactly the contributions it names (every other one was withdrawn) and closes
the round with the same codec and local steps. That gives the leader's weights, outer
momentum, downlink residual and clipping window bit for bit; the standby acks the round
with its weights' digest and writes its own checkpoint.

Anything out of step (a round it does not hold, a payload it cannot place, a
contribution that does not commit, a snapshot that does not verify, or the leader
finding other weights in its ack) makes it ask for a snapshot on its next stream: it
never goes on silently. Anything from an older term than it has seen, in etcd or on the
stream, is refused and ends the stream.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator

import grpc
import torch

from skyfed.compression import PayloadError, decode_payload
from skyfed.coordinator.aggregate import Contribution
from skyfed.coordinator.checkpoint import Checkpoint, CheckpointWriter, section_digest
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.links import CodecRun
from skyfed.coordinator.model import Model
from skyfed.coordinator.replicas.election import Elector, Leader
from skyfed.coordinator.round import Round
from skyfed.errors import FederationError, ProtocolError
from skyfed.proto import serde
from skyfed.proto.chunks import Assembler
from skyfed.wire import (
    Chunk,
    ChunkKind,
    Following,
    Forward,
    LeaderMessage,
    ReplicaAck,
    ReplicaHello,
    RoundClose,
    SnapshotEnd,
    max_payload_bytes,
)

log = logging.getLogger(__name__)

POLL_S = 0.2
"""How often a standby with no leader to follow looks again, and how often a stream looks
whether the leader it follows still leads."""
RETRY_S = 0.5
ENVELOPE_BYTES = 64 << 10
SNAPSHOT_KINDS = (ChunkKind.WEIGHTS, ChunkKind.RESIDUAL, ChunkKind.MOMENTUM)


class OutOfStep(Exception):
    """The standby's state no longer follows the leader's: it asks for a snapshot."""


class StaleTerm(Exception):
    """The stream carries an older term than this standby has seen: it is refused."""


class Replay:
    """Follows whichever replica leads (see the module docstring) on a thread of its own
    from :meth:`start` to :meth:`stop`, which hands the model over."""

    def __init__(self, config: CoordinatorConfig, model: Model, elector: Elector) -> None:
        self.config = config
        self.model = model
        self.elector = elector
        self.term = 0
        """The highest leader's term seen, in etcd or on a stream."""
        self.state = "standby"
        """standby (no stream), catching-up (a stream, no round closed on it yet), following."""
        self.lost_at: float | None = None
        """Monotonic time it last saw a leader go: its stream to it ended, or etcd named
        another (None since it follows one): a failover's duration counts from it."""
        self.followed = ""
        """The replica it followed last."""
        self.last_heard: float | None = None
        """Monotonic time of the last message from the leader it follows: a frozen or
        partitioned leader's stream goes silent, not closed."""
        self._want_snapshot = False
        directory = config.checkpoints.checkpoint_dir
        self._writer = CheckpointWriter(directory) if directory is not None else None
        self._max_payload = max_payload_bytes(model.spec)
        self._stop = threading.Event()
        self._call: grpc.Call | None = None
        self._thread = threading.Thread(target=self._run, name="replay", daemon=True)

    @property
    def held(self) -> int:
        """The last round this standby's state holds (-1: the initial weights)."""
        return self.model.round - 1

    def start(self) -> Replay:
        self._thread.start()
        return self

    def stop(self) -> Model:
        """End the stream; a round close in progress finishes first. The model, in step
        with the last round it closed (and its checkpoint written)."""
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join()
        if self._writer is not None:
            self._writer.close()
        return self.model

    # ---- streams -------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            leader = self.elector.leader
            if leader is None or self.elector.leading or leader.replica == self.elector.replica:
                self._stop.wait(POLL_S)
                continue
            self.term = max(self.term, leader.term)
            try:
                self._follow(leader)
            except OutOfStep as exc:
                log.warning("[Coordinator.Replay] out of step: %s; asking for a snapshot", exc)
                self._want_snapshot = True
            except StaleTerm as exc:
                log.warning("[Coordinator.Replay] %s", exc)
            except FederationError as exc:
                log.warning("[Coordinator.Replay] leader %s: %s", leader.replica, exc)
                self._want_snapshot = True
            except grpc.RpcError as exc:
                code = exc.code()
                if code != grpc.StatusCode.CANCELLED:  # ours: stopped, or a new leader seen
                    self._lost()
                    log.info(
                        "[Coordinator.Replay] stream to %s ended: %s %s",
                        leader.replica,
                        code,
                        exc.details(),
                    )
            finally:
                self.state = "standby"
            self._stop.wait(RETRY_S)

    def _follow(self, leader: Leader) -> None:
        channel = _channel(self.config, leader.address)
        outbox: queue.Queue = queue.Queue()
        call = serde.replicate_stream(channel)(iter(outbox.get, None))
        self._call = call
        watch = threading.Thread(target=self._watch, args=(leader, call), daemon=True)
        try:
            if self._stop.is_set():
                return
            hello = ReplicaHello(
                replica=self.elector.replica,
                term=self.term,
                round=self.held,
                weights_digest=self.model.weights_digest,
                spec_digest=self.model.spec_digest,
                snapshot=self._want_snapshot,
            )
            outbox.put(serde.replica_message_to_proto(hello))
            watch.start()
            messages = (serde.leader_message_from_proto(m) for m in call)
            self._replay(leader, messages, outbox)
        finally:
            outbox.put(None)
            call.cancel()
            channel.close()

    def _watch(self, leader: Leader, call: grpc.Call) -> None:
        """End the stream once ``leader`` no longer leads (etcd names another, or this
        replica was elected): a partition may leave it silent, not closed."""
        while not self._stop.wait(POLL_S) and call.is_active():
            now = self.elector.leader
            if self.elector.leading or now is None or now.term != leader.term:
                if not self.elector.leading:
                    self._lost()
                call.cancel()
                return

    def _lost(self) -> None:
        if self.lost_at is None:
            self.lost_at = time.monotonic()

    def _replay(
        self, leader: Leader, messages: Iterator[LeaderMessage], outbox: queue.Queue
    ) -> None:
        first = next(messages, None)
        if not isinstance(first, Following):
            raise ProtocolError("the leader's first message must be Following")
        self._check_term(first.term)
        if first.snapshot:
            self._load_snapshot(messages)
        if self.model.round != first.round:
            raise OutOfStep(f"the leader's open round is {first.round}, ours {self.model.round}")
        self._want_snapshot = False
        self.state, self.lost_at, self.followed = "catching-up", None, leader.replica
        log.info("[Coordinator.Replay] following %s from round %d", leader.replica, first.round)
        round_ = self.model.open()
        begun: dict[int, Contribution] = {}
        for message in messages:
            self._check_term(message.term)
            self.last_heard = time.monotonic()
            if isinstance(message, Forward):
                self._receive(round_, begun, message, messages)
            elif isinstance(message, RoundClose):
                self._close(round_, begun, message)
                ack = ReplicaAck(self.term, message.round, self.model.weights_digest)
                outbox.put(serde.replica_message_to_proto(ack))
                self.state = "following"
                round_, begun = self.model.open(), {}
            else:
                raise ProtocolError(f"an unexpected {type(message).__name__} from the leader")

    def _check_term(self, term: int) -> None:
        observed = self.elector.leader
        seen = max(self.term, observed.term if observed is not None else 0)
        if term < seen:
            raise StaleTerm(f"refused the leader's state of term {term}: term {seen} is newer")
        self.term = max(seen, term)

    # ---- a round -------------------------------------------------------------------------

    def _receive(
        self,
        round_: Round,
        begun: dict[int, Contribution],
        forward: Forward,
        messages: Iterator[LeaderMessage],
    ) -> None:
        if forward.round != round_.number:
            raise OutOfStep(
                f"a contribution to round {forward.round}; round {round_.number} is open"
            )
        assembler = self._assembler(ChunkKind.GRADIENT, forward.round)
        payload = None
        for _ in range(forward.chunks):
            chunk = next(messages, None)
            if not isinstance(chunk, Chunk):
                raise ProtocolError("a forwarded payload ends before its chunks")
            self._check_term(chunk.term)
            whole = assembler.add(chunk)
            if whole is not None and payload is not None:
                raise ProtocolError("a forward's chunks hold more than one payload")
            payload = whole or payload
        if payload is None:
            raise ProtocolError("a forward's chunks end inside its payload")
        contribution = begun.get(forward.contribution)
        if contribution is None:
            contribution = begun[forward.contribution] = round_.begin(forward.key, forward.samples)
        try:
            round_.receive(contribution, payload)
        except FederationError as exc:
            raise OutOfStep(f"a forwarded payload of {forward.key}: {exc}") from exc

    def _close(self, round_: Round, begun: dict[int, Contribution], close: RoundClose) -> None:
        """Close ``round_`` as the leader did: the contributions it committed, its codec,
        its local steps."""
        if close.round != round_.number:
            raise OutOfStep(f"the leader closes round {close.round}; round {round_.number} is open")
        try:
            for number in close.contributions:
                contribution = begun.pop(number, None)
                if contribution is None:
                    raise OutOfStep(f"contribution {number} of round {close.round} never came")
                round_.commit(contribution)
            for withdrawn in begun.values():
                withdrawn.withdraw()
        except FederationError as exc:
            raise OutOfStep(f"round {close.round} does not commit: {exc}") from exc
        if not close.contributions:
            raise OutOfStep(f"the leader closes round {close.round} with no contribution")
        if self._writer is not None:
            self._writer.wait_written()  # the last checkpoint holds the tensors this changes
        self.model.downlink.run = CodecRun(close.codec, close.codec_since)
        started = time.perf_counter()
        for _ in round_.close(close.codec, close.local_steps):
            pass
        log.info(
            "[Coordinator.Replay] round=%d closed contributors=%d close_s=%.3f digest=%s",
            close.round,
            len(close.contributions),
            time.perf_counter() - started,
            self.model.weights_digest[:16],
        )
        self._checkpoint()

    def _checkpoint(self) -> None:
        if self._writer is not None:
            self._writer.submit(self.model.checkpoint(), self.model.weights_digest)

    # ---- a snapshot ----------------------------------------------------------------------

    def _load_snapshot(self, messages: Iterator[LeaderMessage]) -> None:
        """The leader's state after some round, in chunks, verified, then taken."""
        assemblers = {kind: self._assembler(kind, None) for kind in SNAPSHOT_KINDS}
        datas: dict[ChunkKind, dict[int, bytes]] = {kind: {} for kind in SNAPSHOT_KINDS}
        for count, message in enumerate(messages):
            self._check_term(message.term)
            if isinstance(message, SnapshotEnd):
                self._take(message, datas, count)
                return
            if not isinstance(message, Chunk) or message.kind not in SNAPSHOT_KINDS:
                raise ProtocolError(f"a snapshot holds only its chunks, not {message!r:.80}")
            kind = ChunkKind(message.kind)
            assembler = assemblers[kind]
            if assembler.round is None:
                assembler.round = message.round
            payload = assembler.add(message)
            if payload is not None:
                datas[kind][payload.tensor] = payload.data
        raise OutOfStep("the stream ended inside a snapshot")

    def _take(self, end: SnapshotEnd, datas: dict[ChunkKind, dict[int, bytes]], count: int) -> None:
        if count != end.chunks:
            raise OutOfStep(f"a snapshot of {end.chunks} chunks arrived as {count}")
        weights = self._tensors(datas[ChunkKind.WEIGHTS], "weights")
        residual = self._tensors(datas[ChunkKind.RESIDUAL], "residual") or None
        momentum = self._tensors(datas[ChunkKind.MOMENTUM], "momentum") or None
        for section, tensors, digest in (
            ("residual", residual, end.residual_digest),
            ("outer", momentum, end.momentum_digest),
        ):
            if (section_digest(section, tensors) if tensors else "") != digest:
                raise OutOfStep(f"the snapshot's {section} does not match its digest")
        if self._writer is not None:
            self._writer.wait_written()
        ckpt = Checkpoint(
            round=end.round,
            spec_digest=self.model.spec_digest,
            weights=weights,
            downlink_residual=residual,
            outer_momentum=momentum,
            norms=list(end.norms),
        )
        self.model.resume(ckpt)
        self.model.downlink.run = CodecRun(end.codec, end.codec_since)
        if self.model.weights_digest != end.weights_digest:
            raise OutOfStep("the snapshot's weights do not match their digest")
        log.info("[Coordinator.Replay] snapshot of round %d taken", end.round)
        self._checkpoint()

    def _tensors(self, datas: dict[int, bytes], section: str) -> list[torch.Tensor]:
        """Each tensor of a snapshot's section, decoded (none: the section is empty)."""
        spec = self.model.spec
        if not datas:
            return []
        if sorted(datas) != list(range(len(spec))):
            raise OutOfStep(f"the snapshot's {section} misses tensors")
        try:
            return [decode_payload(datas[i], shape=info.shape) for i, info in enumerate(spec)]
        except PayloadError as exc:
            raise OutOfStep(f"the snapshot's {section} does not decode: {exc}") from exc

    def _assembler(self, kind: int, round_: int | None) -> Assembler:
        return Assembler(
            kind=kind,
            round=round_,  # a snapshot's: set by its first chunk
            num_tensors=len(self.model.spec),
            max_chunk_bytes=self.config.transport.max_chunk_bytes,
            max_payload_bytes=self._max_payload,
        )


def _channel(config: CoordinatorConfig, address: str) -> grpc.Channel:
    """A channel to the leader under this replica's own coordinator certificate."""
    transport = config.transport
    assert transport.ca and transport.cert and transport.key  # checked by CoordinatorConfig
    creds = grpc.ssl_channel_credentials(
        root_certificates=transport.ca.read_bytes(),
        private_key=transport.key.read_bytes(),
        certificate_chain=transport.cert.read_bytes(),
    )
    limit = transport.max_chunk_bytes + ENVELOPE_BYTES
    options = [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.http2.bdp_probe", 1),
    ]
    return grpc.secure_channel(address, creds, options=options)

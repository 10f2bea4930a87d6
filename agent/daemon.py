"""The agent daemon: join, train, contribute, apply; reconnect and resync when links fail."""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time

import grpc

from skyfed.agent import failure
from skyfed.agent.config import AgentConfig
from skyfed.agent.leader import Replicas
from skyfed.agent.link import Link, LinkClosed, open_channel, wait_connected
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalResult
from skyfed.compression import PayloadError, codec_names, frame
from skyfed.compression.spec import parse_spec, wire_spec
from skyfed.errors import ProtocolError
from skyfed.files import write_text_atomic
from skyfed.fingerprint import DIGEST_PREFIX, is_weights_digest
from skyfed.logs import Phases
from skyfed.netinfo import congestion_control, target_host
from skyfed.proto.chunks import DEFAULT_MAX_CHUNK_BYTES, Assembler, cut
from skyfed.wire import (
    EXCHANGES,
    MAX_METRICS,
    Announce,
    Chunk,
    ChunkKind,
    ContributionEnd,
    CoordinatorMessage,
    Hello,
    Leave,
    Receipt,
    RoundEnd,
    WeightsEnd,
    Welcome,
    max_payload_bytes,
    metrics_problem,
    raw_bytes,
)

log = logging.getLogger(__name__)
phase = Phases("Agent", log)
"""A round's phases, timed at DEBUG (``bench/scale.py --phases``, docs/wan.md)."""

# Refusals no retry can fix: the operator must act (wrong certificate, wrong model).
FATAL_CODES = {
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.FAILED_PRECONDITION,
}
WELCOME_TIMEOUT_S = 60.0
LEAVE_FLUSH_S = 2.0
"""How long a failing site waits for its ``Leave`` to reach the wire before it closes."""
MERGE_SLACK_BYTES = 64 << 20
"""What a striped session may hold out of order beyond one transfer of the model."""


class Resync(Exception):
    """Our weights no longer match the coordinator's; reconnect and fetch them."""


class Finished(Exception):
    """The coordinator said final, or our own round budget is spent."""


class SiteDown(Exception):
    """A rank failed (or this one did): the site stops; the reason was said once and,
    where a session was open, sent to the coordinator (``skyfed.agent.failure``)."""


# Ends of a session that are the protocol's own, not a failure of the site.
_SESSION_ENDS = (Finished, LinkClosed, Resync, TimeoutError, SiteDown)


class Agent:
    """One site's session loop, on its rank 0. ``run`` returns when training is over;
    raises on a refusal that is final.

    Every model operation goes through ``site`` (see ``skyfed.agent.site``), which runs it
    on all of the site's local ranks; this class only speaks to the coordinator.
    """

    def __init__(self, config: AgentConfig, site: Site) -> None:
        self.config = config
        self.site = site
        self.spec = site.spec
        self.codec = "fp32"
        self.last_round = -1
        self.applied = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.last_loss = float("nan")
        self.metrics: dict[str, float] = {}
        """The named metrics the site last reported (:meth:`report`)."""
        self._unsent: dict[str, float] = {}  # reported, not yet carried by a contribution
        self._metrics_lock = threading.Lock()
        self.max_chunk_bytes = DEFAULT_MAX_CHUNK_BYTES
        # Rounds contributed but not yet acknowledged: refused ones are credited back.
        self._unacked: set[int] = set()
        # The aggregate being received: its assembler, the payloads and their decoding.
        self._agg: Assembler | None = None
        self._agg_datas: dict[int, bytes] = {}
        self._stopping = False
        self._connected = False
        # Overlap (the welcome says): the round whose contribution is in flight while the
        # next round's local steps run, or None.
        self.overlap = False
        self._pending: int | None = None
        # The last round's end whose digest check still waits (docs/wan.md, "A round's
        # critical path"): the weights hash while the next local steps run, and
        # the check is made before anything leaves or changes from them.
        self._unverified: RoundEnd | None = None
        self.replicas = Replicas(config.coordinators)
        """The coordinator replicas' addresses: the next session dials ``current``."""
        self.term = 0
        """The highest leader's term seen (docs/failover.md): anything from an older term
        is refused, so a deposed leader's round is never applied."""

    @property
    def connected(self) -> bool:
        """In a session with the coordinator now (what the agent's ``/readyz`` answers)."""
        return self._connected

    # ---- the reconnect loop --------------------------------------------------------------

    def run(self) -> None:
        delay = self.config.reconnect_initial_s
        lost_since = time.monotonic()
        while not self._stopping:
            try:
                self._session()
            except Finished:
                log.info(
                    "[Agent.Done] round=%d digest=%s", self.last_round, self.site.digest()[:16]
                )
                return
            except LinkClosed as exc:
                if exc.code in FATAL_CODES:
                    raise
                if self._follow(exc):
                    delay = self.config.reconnect_initial_s  # a named leader: dialled soon
                log.warning(
                    "[Agent.Link] session ended (%s); dialling %s in %.1fs",
                    exc,
                    self.replicas.current,
                    delay,
                )
            except Resync as exc:
                log.warning("[Agent.Resync] %s", exc)
                self.last_round = -1
            else:
                delay = self.config.reconnect_initial_s
            if self._connected:
                lost_since, delay = time.monotonic(), self.config.reconnect_initial_s
            give_up = self.config.give_up_after_s
            if give_up and time.monotonic() - lost_since > give_up:
                raise TimeoutError(f"no session with {self.config.coordinator} for {give_up} s")
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(2 * delay, self.config.reconnect_max_s)

    def stop(self) -> None:
        self._stopping = True

    def report(self, metrics: dict[str, float]) -> None:
        """Named metrics of the site's own (a script's evaluation): the next contribution
        carries them to the coordinator. ``ValueError`` for what the wire would refuse
        (``skyfed.wire.metrics_problem``)."""
        metrics = {name: float(value) for name, value in metrics.items()}
        problem = metrics_problem(metrics)
        if problem is not None:
            raise ValueError(f"site metrics: {problem}")
        with self._metrics_lock:
            self.metrics = dict(metrics)
            self._unsent = dict(metrics)

    def _take_metrics(self) -> dict[str, float]:
        """What the next contribution carries: the script's metrics not yet sent, and the
        site's GPU summary (``GpuBoard.summary``) in what room the wire's bound leaves."""
        with self._metrics_lock:
            unsent, self._unsent = self._unsent, {}
        room = MAX_METRICS - len(unsent)
        gpus = [(k, v) for k, v in self.site.gpus.summary().items() if k not in unsent]
        return {**unsent, **dict(gpus[: max(room, 0)])}

    def _follow(self, closed: LinkClosed) -> bool:
        """Pick the replica the next session dials: the leader a standby named, or the
        next one (docs/failover.md). True when a leader was named."""
        was = self.replicas.current
        named = self.replicas.failed(closed.leader)
        if self.replicas.current != was:
            log.info("[Agent.Leader] %s -> %s", was, self.replicas.current)
        return named

    def _session(self) -> None:
        self._connected = False
        # An aggregate half received on the last session never ends: the coordinator
        # (restarted, or another session) sends the round again from its first chunk. A
        # check still due is the join's now: the hello carries the weights' digest, and
        # the coordinator sends its weights where they differ.
        self._agg, self._agg_datas = None, {}
        self._unverified = None
        address = self.replicas.current
        channel = open_channel(self.config, address)
        try:
            wait_connected(channel)
        except LinkClosed:
            channel.close()
            raise
        link = Link(
            channel,
            coordinator=address,
            dial=lambda: open_channel(self.config, address, own_connection=True),
            max_held_bytes=sum(max_payload_bytes(self.spec)) + MERGE_SLACK_BYTES,
        )
        try:
            self._join(link)
            self._connected = True
            while not self._stopping:
                self._round(link)
        except _SESSION_ENDS:
            raise
        except BaseException as exc:
            reason = self.site.down(exc)
            if reason is None:  # a plain stop
                raise
            self._leave(link, reason)
            raise SiteDown(reason) from exc
        finally:
            link.close()
            channel.close()
            self._forget_unacked()

    def _leave(self, link: Link, reason: str) -> None:
        """Tell the coordinator why this site goes (its status shows it)."""
        try:
            link.send(Leave(reason=failure.printable(reason)))
            link.drain(LEAVE_FLUSH_S)
        except Exception as exc:  # the link may be what failed: the next hello tells
            log.debug("[Agent.Leave] not delivered: %s", exc)

    def _forget_unacked(self) -> None:
        """The session is gone, and with it any receipt still due: whether those rounds
        counted is unknown, and crediting them back could count their work twice. (On a
        live session every contribution gets its receipt, however late: a refusal is
        always credited back, docs/protocol.md.)"""
        for round in sorted(self._unacked):
            self.site.acked(round)
        self._unacked.clear()

    # ---- one session ---------------------------------------------------------------------

    def _join(self, link: Link) -> None:
        hello = Hello(
            cloud=self.config.cloud,
            name=self.config.name,
            task=self.site.trainer.task_name,
            tensors=list(self.spec),
            dp=self.site.layout[0],
            tp=self.site.layout[1],
            last_error=failure.kept(self.config.state_dir),
            codecs=tuple(codec_names()),
            last_round=self.last_round,
            weights_digest=self.site.digest(),
            exchanges=self.site.trainer.exchanges,
            max_streams=self.config.max_streams,
            local_steps=self.config.local_steps,
            # The N policy reads it: Mathis's cap bounds a stream only where an end's
            # congestion control backs off on random loss (coordinator/streams.py).
            congestion_control=congestion_control(target_host(self.replicas.current)).name,
        )
        link.send(hello)
        link.answered()
        welcome = self._expect(link, (Welcome,), WELCOME_TIMEOUT_S)
        assert isinstance(welcome, Welcome)
        self._fenced(welcome.term, "welcome")
        if welcome.frame_version != frame.VERSION:  # every payload either way would be refused
            raise LinkClosed(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the coordinator speaks payload frames version {welcome.frame_version or 1}; "
                f"this agent speaks version {frame.VERSION}: run the same skyfed on both",
            )
        self.codec = self._checked_codec(
            welcome.round, wire_spec(welcome.codec, welcome.codec_params)
        )
        exchange = welcome.exchange or "delta"  # a coordinator from before the field
        if exchange not in EXCHANGES:  # a coordinator newer than this agent
            raise LinkClosed(grpc.StatusCode.FAILED_PRECONDITION, f"unknown exchange {exchange!r}")
        self.site.set_exchange(exchange, welcome.sgd_lr, welcome.sgd_momentum)
        self.max_chunk_bytes = welcome.max_chunk_bytes
        self.overlap, self._pending = welcome.overlap, None
        failure.told(self.config.state_dir)  # the hello carried it: the coordinator knows
        link.start_heartbeats(welcome.heartbeat_ms / 1000)
        final = self._receive_weights(link) if welcome.weights_follow else False
        self.last_round = welcome.round - 1
        log.info(
            "[Agent.Join] identity=%s round=%d term=%d codec=%s exchange=%s overlap=%s",
            welcome.identity,
            welcome.round,
            welcome.term,
            self.codec,
            exchange,
            self.overlap,
        )
        if final:  # we missed the last round (a cut link): these weights are the result
            self._write_report(self.site.digest())
            raise Finished

    def _receive_weights(self, link: Link) -> bool:
        """Load the coordinator's weights; True if the federation has finished with them."""
        assembler = self._assembler(ChunkKind.WEIGHTS, None)
        datas: dict[int, bytes] = {}
        while True:
            message = self._expect(link, (Chunk, WeightsEnd), WELCOME_TIMEOUT_S)
            assert isinstance(message, Chunk | WeightsEnd)
            self._fenced(message.term, "weights")
            if isinstance(message, WeightsEnd):
                break
            if assembler.round is None:
                assembler.round = message.round
            payload = assembler.add(message)
            if payload is not None:
                datas[payload.tensor] = payload.data
        end = message
        _check_digest_kind(end.weights_digest)
        if len(datas) != len(self.spec) or end.chunks != assembler.next_seq:
            raise Resync(f"weights transfer incomplete ({len(datas)} tensors)")
        try:
            self.site.load([datas[i] for i in range(len(datas))])
        except PayloadError as exc:
            raise Resync(f"undecodable weights: {exc}") from exc
        if self.site.digest() != end.weights_digest:
            raise Resync("received weights do not match the coordinator's digest")
        log.info("[Agent.Sync] weights of round %d loaded", end.round)
        return end.final

    def _round(self, link: Link) -> None:
        if self.overlap:
            self._overlapped_round(link)
            return
        target = self.last_round + 1
        phase(target, "train_begin")
        result = self.site.train()
        phase(target, "train_end")
        self.last_loss = result.loss
        self._pump(link, timeout=0)
        self._verify(trained_from=target - 1)
        if self.last_round >= target:  # the round closed while we trained: keep the work
            self.site.keep()
        else:
            self._contribute(link, target, result)
        while self.last_round < target:
            self._pump(link, timeout=1.0)

    def _overlapped_round(self, link: Link) -> None:
        """Local steps of the next round while the previous round's exchange is in flight
        (docs/wan.md#overlap). The weights are the federation's after ``last_round``; the
        contribution to ``last_round + 1`` may still be in flight (``_pending``). Its
        aggregate is applied once these steps end and before they are contributed, so the
        round after trains one round stale, and every agent applies the same aggregate
        after the same steps: all stay bit-identical with the coordinator."""
        in_flight = self._pending is not None and self._pending > self.last_round
        target = self.last_round + 1 + int(in_flight)
        budget = self.config.rounds
        if budget and self.applied + in_flight >= budget:
            while True:  # every round of our budget is contributed: the last aggregate ends it
                self._pump(link, timeout=1.0)
        trained_from = self.last_round
        # Marked for the round these steps contribute to: they begin before it opens (the
        # round before is still in flight), so bench/phases.py's first segment goes below
        # zero and "encode" holds the wait for the aggregate, its apply and the encode.
        phase(target, "train_begin")
        result = self._train_while_pumping(link)
        phase(target, "train_end")
        self.last_loss = result.loss
        while self.last_round < target - 1:  # the previous round's aggregate, applied
            self._pump(link, timeout=1.0)
        self._pump(link, timeout=0)
        self._verify(trained_from)
        if self.last_round >= target:  # the round closed without us: keep the work
            self.site.keep()
        else:
            self._contribute(link, target, result)
            self._pending = target

    def _train_while_pumping(self, link: Link) -> LocalResult:
        """``site.train()`` on a thread while this one receives and decodes the aggregate.
        What changes the model (a round's end, a receipt) waits for the steps to end, and so
        does every message after it, in order."""
        box: dict[str, object] = {}

        def steps() -> None:
            try:
                box["result"] = self.site.train()
            except BaseException as exc:  # re-raised on this thread below
                box["error"] = exc

        worker = threading.Thread(target=steps, name="local-steps", daemon=True)
        worker.start()
        deferred: list[CoordinatorMessage] = []
        try:
            while worker.is_alive():
                message = link.recv(0.05)
                while message is not None:
                    if deferred or isinstance(message, RoundEnd | Receipt):
                        deferred.append(message)
                    else:
                        self._handle(message)  # an aggregate chunk: decoded now
                    message = link.recv(0)
        finally:
            worker.join()
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        for message in deferred:
            self._handle(message)
        result = box["result"]
        assert isinstance(result, LocalResult)
        return result

    def _contribute(self, link: Link, round: int, result: LocalResult) -> None:
        """Announce, then stream: each payload's chunks are queued as soon as it is
        encoded, and the count comes last in a ``ContributionEnd`` (docs/scale.md,
        Streams)."""
        self._unacked.add(round)
        link.send(
            Announce(
                round=round,
                chunks=0,
                samples=result.samples,
                loss=result.loss if math.isfinite(result.loss) else None,
                train_s=result.train_s,
                raw_bytes=raw_bytes(self.spec),
                metrics=self._take_metrics(),
            )
        )
        payloads = self.site.stream_contribution(round, self.codec)  # every rank's shards
        encoding_s, sent = 0.0, 0
        while True:
            started = time.monotonic()
            payload = next(payloads, None)
            encoding_s += time.monotonic() - started
            if payload is None:
                break
            # One chunk at a time: each slice of a payload is converted for the wire and
            # dropped before the next is cut (not a second copy of the whole contribution).
            for chunk in cut(
                payload,
                kind=ChunkKind.GRADIENT,
                round=round,
                first_seq=sent,
                max_chunk_bytes=self.max_chunk_bytes,
            ):
                link.send(chunk)
                self.bytes_up += len(chunk.data)
                sent += 1
        link.send(ContributionEnd(round=round, chunks=sent))
        link.encoded(round, encoding_s)
        phase(round, "sent", encode_s=encoding_s)

    # ---- incoming ------------------------------------------------------------------------

    def _pump(self, link: Link, timeout: float) -> None:
        """Handle every message that is there (waiting up to ``timeout`` for the first)."""
        message = link.recv(timeout)
        while message is not None:
            self._handle(message)
            message = link.recv(0)

    def _handle(self, message: CoordinatorMessage) -> None:
        if isinstance(message, Chunk):
            self._aggregate_chunk(message)
        elif isinstance(message, RoundEnd):
            self._round_end(message)
        elif isinstance(message, Receipt):
            self._receipt(message)
        elif isinstance(message, Welcome):
            raise ProtocolError("a second welcome on one session")

    def _aggregate_chunk(self, chunk: Chunk) -> None:
        self._fenced(chunk.term, f"an aggregate chunk of round {chunk.round}")
        self.bytes_down += len(chunk.data)
        if self._agg is None or self._agg.round != chunk.round:
            if self.site.applying:  # a partly applied aggregate that will never end
                raise Resync(f"an aggregate cut short by round {chunk.round}'s")
            phase(chunk.round, "aggregate_begin")
            self._agg = self._assembler(ChunkKind.AGGREGATE, chunk.round)
            self._agg_datas = {}
        payload = self._agg.add(chunk)
        if payload is None:
            return
        if self.overlap or not self.site.solo:  # decoded into the weights at the round's end
            self._agg_datas[payload.tensor] = payload.data
            return
        # Without overlap nothing else reads the weights until the round ends, so each
        # payload is decoded into them as it arrives, beside the rest of the broadcast
        # (docs/wan.md, "A round's critical path").
        self._verify()  # the last round's check first: the weights change now
        try:
            self.site.apply_payload(chunk.round, payload.tensor, payload.data)
        except PayloadError as exc:
            raise Resync(f"undecodable aggregate of round {chunk.round}: {exc}") from exc
        self._agg_datas[payload.tensor] = b""  # applied: only its arrival is kept

    def _round_end(self, end: RoundEnd) -> None:
        self._fenced(end.term, f"the end of round {end.round}")
        agg, datas = self._agg, self._agg_datas
        if agg is None or agg.round != end.round or agg.next_seq != end.chunks:
            raise Resync(f"aggregate of round {end.round} arrived incomplete")
        if len(datas) != len(self.spec):
            raise Resync(f"aggregate of round {end.round} misses tensors")
        phase(end.round, "round_end")
        self._verify()  # the last round's check first: the weights change now
        try:  # a payload that does not decode leaves us to resync
            if self.site.applying:  # decoded as they came (_aggregate_chunk)
                self.site.finish_apply(end.round)
            else:
                self.site.apply(end.round, [datas[i] for i in range(len(datas))])
        except PayloadError as exc:
            raise Resync(f"undecodable aggregate of round {end.round}: {exc}") from exc
        self._agg, self._agg_datas = None, {}
        phase(end.round, "applied")
        self.last_round, self.applied = end.round, self.applied + 1
        self.site.persist(end.round)
        spec = wire_spec(end.codec, end.codec_params)
        if spec != self.codec:
            log.info("[Agent.Codec] %s -> %s from round %d", self.codec, spec, end.round + 1)
            self.codec = self._checked_codec(end.round + 1, spec)
        self._unverified = end
        last = end.final or (self.config.rounds and self.applied >= self.config.rounds)
        if last or not self.site.solo:  # the last weights, or a digest that is a collective
            self._verify()
        if last:
            raise Finished

    def _verify(self, trained_from: int | None = None) -> None:
        """The digest check of the last round's end, if still due: our weights must be the
        coordinator's before any contribution or kept delta leaves from them (local steps
        from the weights after round ``trained_from``; with overlap the check of a later
        round waits for the steps that start from it), and before they change again. The
        weights have not changed since that end (local steps put them back), and on a solo
        CPU site their digest was begun as the aggregate was applied and finished during
        the first local step, so this rarely waits. A mismatch raises ``Resync``: the
        local result is dropped, nothing is sent."""
        end = self._unverified
        if end is None or (trained_from is not None and end.round > trained_from):
            return
        self._unverified = None
        started = time.monotonic()
        digest = self.site.digest()
        phase(end.round, "digested", wait_s=time.monotonic() - started, digest=digest[:16])
        _check_digest_kind(end.weights_digest)
        if digest != end.weights_digest:
            raise Resync(f"after round {end.round} our weights differ from the coordinator's")
        self._write_report(digest)

    def _receipt(self, receipt: Receipt) -> None:
        phase(receipt.round, "receipt")
        if receipt.round not in self._unacked:
            return
        self._unacked.discard(receipt.round)
        if receipt.accepted:
            self.site.acked(receipt.round)
            return
        log.info("[Agent.Refused] round=%d: %s", receipt.round, receipt.message)
        if receipt.code == grpc.StatusCode.ALREADY_EXISTS.value[0]:
            # An earlier run of this agent was counted for that round: crediting this work
            # back would train on the same data twice.
            self.site.acked(receipt.round)
            return
        self.site.refused(receipt.round)  # every rank credits its shards back

    # ---- helpers -------------------------------------------------------------------------

    def _fenced(self, term: int, what: str) -> None:
        """Refuse ``what`` if it carries an older leader's term than one already seen: the
        session ends (nothing of it is applied) and the agent looks for the leader."""
        if term < self.term:
            log.warning(
                "[Agent.Term] refused %s of term %d: term %d leads; looking for the leader",
                what,
                term,
                self.term,
            )
            raise LinkClosed(
                grpc.StatusCode.ABORTED, f"a deposed leader's {what} (term {term} < {self.term})"
            )
        self.term = term

    def _assembler(self, kind: int, round: int | None) -> Assembler:
        return Assembler(
            kind=kind,
            round=round,
            num_tensors=len(self.spec),
            max_chunk_bytes=self.max_chunk_bytes,
            max_payload_bytes=max_payload_bytes(self.spec),
        )

    def _expect(self, link: Link, kinds: tuple[type, ...], timeout: float) -> CoordinatorMessage:
        names = tuple(k.__name__ for k in kinds)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = link.recv(max(0.0, deadline - time.monotonic()))
            if message is not None and isinstance(message, kinds):
                return message
            if message is not None:
                raise ProtocolError(f"expected {names}, got {type(message).__name__}")
        raise LinkClosed(grpc.StatusCode.DEADLINE_EXCEEDED, f"no {names} within {timeout} s")

    def _checked_codec(self, round: int, spec: str) -> str:
        """A codec spec we can build (the site builds it for ``round`` now, once), or a
        resync: never a crash in the middle of a round."""
        try:
            self.site.codec(round, spec)
        except ValueError as exc:
            raise Resync(f"the coordinator named a codec this agent cannot build: {exc}") from exc
        return spec

    def _write_report(self, digest: str) -> None:
        if self.config.report is None:
            return
        report = {
            "cloud": self.config.cloud,
            "name": self.config.name,
            "round": self.last_round,
            "rounds_applied": self.applied,
            "weights_digest": digest,
            "loss": self.last_loss,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "codec": parse_spec(self.codec)[0],
            "layout": {"dp": self.site.layout[0], "tp": self.site.layout[1]},
            "gpus": self.site.gpus.as_list(),
        }
        write_text_atomic(self.config.report, json.dumps(report, indent=1))


def _check_digest_kind(digest: str) -> None:
    """A coordinator from before the v3 weights digest (a sha256 tree) would never match
    ours: resyncing round after round hides that, so the agent stops with one line."""
    if not is_weights_digest(digest):
        raise LinkClosed(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the coordinator's weights digest is from before {DIGEST_PREFIX!r} (a sha256 "
            f"tree); this agent compares the {DIGEST_PREFIX!r} crc32 tree: upgrade the coordinator",
        )

"""The federation's round engine: membership, contributions, closing, the downlink.

Round r opens; every live member may contribute once; the round closes when all live
members have committed, or when a quorum has and the deadline has passed. Closing takes
the weighted mean, applies the outer step, encodes the update once for every link
(DoubleSqueeze-style, with one coordinator-side residual), applies exactly the decoded
update to the canonical weights, checkpoints, and only then broadcasts: so every agent
applies the same bytes, and no acknowledged round is ever lost.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import torch
from google.protobuf import json_format

from skyfed.compression import make_codec, rounding_seed
from skyfed.compression.feedback import released
from skyfed.coordinator import checkpoint
from skyfed.coordinator.aggregate import Contribution, RoundAggregate
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.links import Links
from skyfed.coordinator.session import Session
from skyfed.coordinator.status_codes import status_code
from skyfed.errors import (
    AlreadyContributedError,
    FederationError,
    IdentityMismatchError,
    LateContributionError,
    ModelMismatchError,
    ProtocolError,
    UnsupportedExchangeError,
)
from skyfed.fingerprint import TensorInfo, describe_mismatch, spec_digest, weights_digest
from skyfed.proto import federation_pb2 as pb
from skyfed.proto.chunks import Assembler, Payload, cut_all
from skyfed.proto.serde import specs_from_proto

log = logging.getLogger(__name__)

# Heavier compression later in the list; the downlink uses the heaviest codec any member's
# link uses this round, so the single broadcast payload suits the worst link.
CODEC_WEIGHT = {"fp32": 0, "bf16": 1, "fp16": 2, "topk": 3, "ecsgd": 4}
HISTORY = 1000
# Who sends the downlink, for its rounding seed (agent names default to <cloud>-<n>).
DOWNLINK_SENDER = "coordinator"


def running(ran: tuple[str, int], codec: str, round_: int) -> tuple[str, int]:
    """A link's ``(codec, first round)`` once it runs ``codec`` in ``round_``: unchanged
    if it ran that codec already, else from ``round_``; a first codec from round 0, as a
    late join or a coordinator restart meets residuals that kept their work, and Top-k's
    warm-up, which counts from the second figure, must not start again for them."""
    if codec == ran[0]:
        return ran
    return (codec, round_ if ran[0] else 0)


@dataclass(slots=True)
class RoundStats:
    round: int
    opened_at: float
    duration_s: float = 0.0
    train_s: float = 0.0
    contributors: int = 0
    mean_loss: float = float("nan")
    bytes_up: int = 0
    bytes_down: int = 0
    raw_bytes_up: int = 0
    raw_bytes_down: int = 0
    downlink_codec: str = ""


class Federation:
    """All state shared by the sessions, guarded by one condition variable."""

    def __init__(
        self, config: CoordinatorConfig, spec: Sequence[TensorInfo], weights: list[torch.Tensor]
    ) -> None:
        self.config = config
        self.spec = list(spec)
        self.digest = spec_digest(self.spec)
        self.weights = weights
        self.residual: list[torch.Tensor] | None = None
        self.round = 0
        # The downlink's codec and the round it started; Top-k's warm-up counts from it.
        self.downlink_ran: tuple[str, int] = ("", 0)
        self.sessions: dict[str, Session] = {}
        self.cond = threading.Condition()
        self.started_at = time.monotonic()
        self.finished = False
        self.stopping = False
        self.history: deque[RoundStats] = deque(maxlen=HISTORY)
        self.stats = RoundStats(self.round, time.monotonic())
        self._losses: list[float] = []
        self._train_s: list[float] = []
        self.aggregate = RoundAggregate(self.spec)
        self.contributed: set[str] = set()
        self.round_open = False
        self._first_round = True
        self.max_payload = [t.numel * 4 + 4096 for t in self.spec]
        self.links = Links(
            config.codec, config.policy, config.monitor, [t.numel for t in self.spec]
        )
        self._resume()
        self.weights_digest = weights_digest(self.weights)

    # ---- joining -------------------------------------------------------------------------

    def join(self, session: Session, hello: pb.Hello) -> None:
        """Check a hello against the certificate and the model; welcome or raise."""
        ident = session.identity
        if ident.role != "agent":
            raise IdentityMismatchError(f"certificate {ident.uri} is not an agent's")
        if (hello.cloud, hello.name) != (ident.cloud, ident.name):
            raise IdentityMismatchError(
                f"hello claims cloud={hello.cloud!r} name={hello.name!r} but the certificate "
                f"says cloud={ident.cloud!r} name={ident.name!r}"
            )
        theirs = specs_from_proto(hello.tensors)
        if theirs != self.spec:
            raise ModelMismatchError(
                f"model fingerprint differs from the federation's ({self.config.task}, "
                f"{self.digest}): {describe_mismatch(self.spec, theirs)}"
            )
        offered = list(hello.exchanges) or ["delta"]  # agents from before the field
        if self.config.exchange not in offered:
            raise UnsupportedExchangeError(
                f"this federation exchanges {self.config.exchange!r}; the agent offers "
                f"{offered} (upgrade it)"
            )
        with self.cond:
            self._replace_existing(session)
            session.codecs = frozenset(hello.codecs)
            self.links.open(session)
            session.codec = self._link_codec(session)
            self._ran(session, self.round)
            session.tp = max(1, hello.tp)
            behind = (
                self.finished  # the final weights follow, and tell it to stop
                or hello.last_round != self.round - 1
                or hello.weights_digest != self.weights_digest
            )
            self.sessions[session.key] = session
            session.state = "syncing" if behind else "idle"
            session.send(self._welcome(session, behind))
            if behind:
                for message in self._weights_messages():
                    session.send(message)
            session.state = "idle"
            log.info(
                "[Coordinator.Join] agent=%s round=%d resync=%s codec=%s tp=%d",
                ident.uri,
                self.round,
                behind,
                session.codec,
                session.tp,
            )
            self.cond.notify_all()

    def _replace_existing(self, session: Session) -> None:
        old = self.sessions.get(session.key)
        if old is not None and old is not session:
            self._forget(old)
            old.close(grpc.StatusCode.ABORTED, "replaced by a newer session of the same identity")

    def _ran(self, session: Session, round_: int) -> None:
        """Note that the link runs ``session.codec`` from ``round_`` on (the link is kept
        per agent, so a reconnect on the same codec goes on where it was)."""
        link = self.links.get(session)
        if link is not None:
            link.ran = running(link.ran, session.codec, round_)

    def _codec_params(self, session: Session, round_: int) -> str:
        """The policy's parameters for the link's codec in ``round_`` as JSON, so the agent
        encodes exactly that."""
        link = self.links.get(session)
        since = link.ran[1] if link is not None else 0
        params = self.config.policy.codec_params(session.codec, round_ - since)
        return json.dumps(params, sort_keys=True) if params else ""

    def _welcome(self, session: Session, weights_follow: bool) -> pb.CoordinatorMessage:
        welcome = pb.Welcome(
            round=self.round,
            weights_follow=weights_follow,
            codec=session.codec,
            codec_params=self._codec_params(session, self.round),
            max_chunk_bytes=self.config.max_chunk_bytes,
            heartbeat_ms=self.config.heartbeat_ms,
            identity=session.identity.uri,
            exchange=self.config.exchange,
            sgd_lr=self.config.sgd_lr,
            sgd_momentum=self.config.sgd_momentum,
        )
        link = self.links.get(session)
        if self.links.echo is not None and link is not None and link.probe is not None:
            welcome.probe_port = self.links.echo.port
            welcome.probe_key, welcome.probe_id = link.probe.key, link.probe.probe_id
            welcome.probe_interval_ms = self.config.probe_interval_ms
        return pb.CoordinatorMessage(welcome=welcome)

    def _weights_messages(self) -> list[pb.CoordinatorMessage]:
        fp32 = make_codec("fp32")
        payloads = [Payload(i, None, "fp32", fp32.encode(w)) for i, w in enumerate(self.weights)]
        chunks = cut_all(
            payloads,
            kind=pb.Chunk.WEIGHTS,
            round=self.round - 1,
            max_chunk_bytes=self.config.max_chunk_bytes,
        )
        out = [pb.CoordinatorMessage(chunk=c) for c in chunks]
        end = pb.WeightsEnd(
            round=self.round - 1,
            chunks=len(out),
            weights_digest=self.weights_digest,
            final=self.finished,
        )
        return [*out, pb.CoordinatorMessage(weights_end=end)]

    def leave(self, session: Session) -> None:
        with self.cond:
            if self.sessions.get(session.key) is session:
                self._forget(session)
                self.links.close(session)
                del self.sessions[session.key]
                log.info("[Coordinator.Leave] agent=%s round=%d", session.key, self.round)
            self.cond.notify_all()

    def _forget(self, session: Session) -> None:
        """Withdraw whatever the session had half-sent; it never reaches the aggregate."""
        if session.contribution is not None and not session.contribution.done:
            session.contribution.withdraw()
        session.contribution = None
        session.assembler = None
        session.state = "disconnected"

    # ---- contributions -------------------------------------------------------------------

    def begin(self, session: Session, header: pb.Contribution) -> None:
        """Open a contribution; a late one is refused in-band and its chunks discarded."""
        with self.cond:
            self._require_member(session)
            if session.contribution is not None and not session.contribution.done:
                raise ProtocolError("a contribution was announced before the previous one ended")
            if header.round > self.round or header.round < 0:
                raise ProtocolError(
                    f"contribution for round {header.round}, but round {self.round} is open"
                )
            if header.chunks < 1 or header.chunks > 1 << 24:
                raise ProtocolError(f"contribution announces {header.chunks} chunks")
            if header.samples < 1:
                raise ProtocolError(
                    f"a contribution must count at least 1 sample, got {header.samples}"
                )
            # A contribution for the round not yet open (waiting for min_agents) is early,
            # not late: it is summed and counts once the round opens.
            if header.round < self.round:
                self._refuse(
                    session,
                    header,
                    LateContributionError(
                        f"round {header.round} closed before this contribution arrived; round "
                        f"{self.round} is open (keep it in the error-feedback residual)"
                    ),
                )
                return
            if session.last_round == self.round:
                raise ProtocolError(f"a second contribution for round {self.round}")
            if session.key in self.contributed:  # a restarted agent, already counted
                self._refuse(
                    session,
                    header,
                    AlreadyContributedError(
                        f"an earlier session of {session.key} already contributed to round "
                        f"{self.round}; drop this work, it would count the same data twice"
                    ),
                )
                return
            session.contribution = self.aggregate.begin(header.samples)
            session.contribution_round = header.round
            session.chunks_expected, session.chunks_seen = header.chunks, 0
            session.assembler = Assembler(
                kind=pb.Chunk.GRADIENT,
                round=header.round,
                num_tensors=len(self.spec),
                max_chunk_bytes=self.config.max_chunk_bytes,
                max_payload_bytes=self.max_payload,
            )
            session.state = "sending"
            self.links.get(session).upload_begins(session.bytes_up, time.monotonic())
            session.pending_loss, session.pending_train_s = header.loss, header.train_s
            self.stats.raw_bytes_up += header.raw_bytes

    def _refuse(self, session: Session, header: pb.Contribution, err: FederationError) -> None:
        """Refuse a contribution in-band: the session goes on, its chunks are discarded."""
        session.discard_round, session.discard_left = header.round, header.chunks
        session.refused += 1
        log.info(
            "[Coordinator.Refuse] agent=%s round=%d open=%d: %s",
            session.key,
            header.round,
            self.round,
            err,
        )
        receipt = pb.Receipt(
            round=header.round, accepted=False, code=status_code(err).value[0], message=str(err)
        )
        session.send(pb.CoordinatorMessage(receipt=receipt))

    def chunk(self, session: Session, chunk: pb.Chunk) -> None:
        """Validate and add one chunk; completes the contribution on its last chunk.

        Runs on the session's reader thread: decoding and checks happen outside the lock,
        only the addition into the round's sum happens under it.
        """
        session.bytes_up += len(chunk.data)
        with self.cond:
            self.stats.bytes_up += len(chunk.data)
            if session.discard_left and chunk.round == session.discard_round:
                session.discard_left -= 1
                return
            assembler, contribution = session.assembler, session.contribution
        if assembler is None or contribution is None:
            raise ProtocolError("a chunk arrived outside an announced contribution")
        payload = assembler.add(chunk)
        session.chunks_seen += 1
        if payload is not None:
            values = contribution.check(payload)
            with self.cond:
                contribution.apply(payload, values)
        if session.chunks_seen == session.chunks_expected:
            if assembler.mid_payload:
                raise ProtocolError("the contribution's last chunk ends inside a payload")
            self._finish(session, contribution)

    def _finish(self, session: Session, contribution: Contribution) -> None:
        with self.cond:
            if contribution.done:
                return  # withdrawn meanwhile: the round closed under it and it was refused
            contribution.commit()
            session.contribution, session.assembler = None, None
            session.last_round = session.contribution_round
            self.links.get(session).upload_done(
                session.bytes_up, time.monotonic(), session.pending_train_s
            )
            session.state = "idle"
            self.contributed.add(session.key)
            self._losses.append(session.pending_loss)
            self._train_s.append(session.pending_train_s)
            receipt = pb.Receipt(round=session.last_round, accepted=True)
            session.send(pb.CoordinatorMessage(receipt=receipt))
            self.cond.notify_all()

    def _require_member(self, session: Session) -> None:
        if self.sessions.get(session.key) is not session:
            raise ProtocolError("send hello first")

    # ---- closing -------------------------------------------------------------------------

    def run(self) -> None:
        """Drive rounds until the configured count or :meth:`stop`; meant for its own thread."""
        with self.cond:
            while not self.stopping and not self.finished:
                self._expire_silent()
                if not self.round_open:
                    self._maybe_open()
                elif self._should_close():
                    self._close_round()
                self.cond.wait(timeout=0.05)
            # Agents close their streams once they have applied the final round. Until
            # then its broadcast may still be crossing a slow link: closing at once (the
            # server stopping right behind) cut a lossy link's final round off mid-transfer
            # and left that agent reconnecting to nothing.
            deadline = time.monotonic() + self.config.final_wait_s
            while not self.stopping and self.sessions and time.monotonic() < deadline:
                self.cond.wait(timeout=0.05)
            for s in self.sessions.values():
                s.close()  # after the queued final messages

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def _maybe_open(self) -> None:
        """Round 0, and the first round after a restart, wait for ``min_agents``."""
        needed = self.config.min_agents if self._first_round else 1
        if len(self.sessions) < needed:
            return
        self._first_round = False
        self.round_open = True
        self.stats = RoundStats(self.round, time.monotonic())
        log.info("[Coordinator.Round] round=%d opened agents=%d", self.round, len(self.sessions))

    def _should_close(self) -> bool:
        committed = self.aggregate.committed
        if committed == 0:
            return False
        if all(key in self.contributed for key in self.sessions):
            return True
        late = time.monotonic() - self.stats.opened_at >= self.config.round_deadline_s
        return late and committed >= self.config.quorum

    def _close_round(self) -> None:
        # Anything half-sent is now late: withdraw it before the mean is taken.
        for s in self.sessions.values():
            if s.contribution is not None and not s.contribution.done:
                left = s.chunks_expected - s.chunks_seen
                self._forget(s)
                s.state = "idle"
                late = LateContributionError(
                    f"round {self.round} closed while this contribution was arriving"
                )
                self._refuse(s, pb.Contribution(round=self.round, chunks=left), late)
        update = self.aggregate.mean()
        if self.config.outer_lr != 1.0:
            update = [u * self.config.outer_lr for u in update]
        codec_name = self._downlink_codec()
        contributors = self.aggregate.committed
        payloads = self._encode_downlink(update, codec_name, contributors)
        self.weights_digest = weights_digest(self.weights)
        final = self.config.rounds > 0 and self.round + 1 >= self.config.rounds
        self._checkpoint()
        self._record_round(codec_name, contributors)
        self._broadcast(payloads, contributors, final)
        self.write_status()
        self.round += 1
        self.finished = final
        self.aggregate = RoundAggregate(self.spec)
        self.contributed = set()
        self.round_open = False
        if not final:
            self._maybe_open()

    def _encode_downlink(
        self, update: list[torch.Tensor], codec_name: str, contributors: int
    ) -> list[Payload]:
        """Encode ``update`` (+ residual) once; apply exactly what agents will decode."""
        self.downlink_ran = running(self.downlink_ran, codec_name, self.round)
        params = self.config.policy.codec_params(codec_name, self.round - self.downlink_ran[1])
        seed = rounding_seed(self.config.seed, DOWNLINK_SENDER, self.round)
        codec = make_codec(codec_name, seed=seed, **params).for_downlink(contributors)
        if codec.lossless and self.residual is None:  # nothing held, nothing to hold
            for w, u in zip(self.weights, update, strict=True):
                w.sub_(u)
            return [Payload(i, None, codec_name, codec.encode(u)) for i, u in enumerate(update)]
        if self.residual is None:
            self.residual = [torch.zeros_like(w) for w in self.weights]
        pending, held = {}, {}
        for i, u in enumerate(update):
            pending[str(i)], held[i] = released(codec, u, self.residual[i])
        payloads = []
        for key, each in codec.plan(pending).items():  # Top-k: one threshold for the model
            i = int(key)
            data, self.residual[i] = each.encode_with_feedback(pending[key], None)
            if held[i] is not None:
                self.residual[i] += held[i]
            self.weights[i].sub_(each.decode(data))
            payloads.append(Payload(i, None, codec_name, data))
        if codec.lossless and all(h is None for h in held.values()):
            self.residual = None  # a lossless round that released everything owes nothing
        return payloads

    def _broadcast(self, payloads: list[Payload], contributors: int, final: bool) -> None:
        chunks = [
            pb.CoordinatorMessage(chunk=c)
            for c in cut_all(
                payloads,
                kind=pb.Chunk.AGGREGATE,
                round=self.round,
                max_chunk_bytes=self.config.max_chunk_bytes,
            )
        ]
        for s in list(self.sessions.values()):
            before = s.bytes_down
            for message in chunks:
                s.send(message)
            codec = self._link_codec(s)
            if codec != s.codec:
                self.links.switched(s, codec)
                s.codec = codec
                self._ran(s, self.round + 1)
            s.send(
                pb.CoordinatorMessage(
                    round_end=pb.RoundEnd(
                        round=self.round,
                        chunks=len(chunks),
                        weights_digest=self.weights_digest,
                        contributors=contributors,
                        mean_loss=self.stats.mean_loss,
                        codec=s.codec,
                        codec_params=self._codec_params(s, self.round + 1),
                        final=final,
                    )
                )
            )
            self.stats.bytes_down += s.bytes_down - before

    def _record_round(self, codec_name: str, contributors: int) -> None:
        """Close the round's stats; ``bytes_down`` is added by the broadcast that follows."""
        st = self.stats
        st.duration_s = time.monotonic() - st.opened_at
        st.contributors = contributors
        st.mean_loss = sum(self._losses) / len(self._losses) if self._losses else float("nan")
        # The slowest contributor's compute is the round's critical path; the rest is exchange.
        st.train_s = max(self._train_s, default=0.0)
        st.raw_bytes_down = sum(t.numel * 4 for t in self.spec) * len(self.sessions)
        st.downlink_codec = codec_name
        self.history.append(st)
        self._losses, self._train_s = [], []
        log.info(
            "[Coordinator.Round] round=%d closed agents=%d loss=%.4f duration_s=%.3f down=%s",
            st.round,
            contributors,
            st.mean_loss,
            st.duration_s,
            codec_name,
        )

    def _checkpoint(self) -> None:
        if self.config.checkpoint_dir is None:
            return
        checkpoint.save(
            self.config.checkpoint_dir,
            checkpoint.Checkpoint(
                round=self.round,
                spec_digest=self.digest,
                weights=self.weights,
                downlink_residual=self.residual,
            ),
        )

    def _resume(self) -> None:
        if self.config.checkpoint_dir is None:
            return
        ckpt = checkpoint.load(self.config.checkpoint_dir)
        if ckpt is None:
            return
        if ckpt.spec_digest != self.digest:
            raise RuntimeError(
                f"checkpoint in {self.config.checkpoint_dir} is for model {ckpt.spec_digest}, "
                f"this federation trains {self.digest}"
            )
        self.weights, self.residual, self.round = (
            ckpt.weights,
            ckpt.downlink_residual,
            ckpt.round + 1,
        )
        log.info("[Coordinator.Resume] round=%d from=%s", self.round, self.config.checkpoint_dir)

    # ---- links and liveness --------------------------------------------------------------

    def _link_codec(self, session: Session) -> str:
        """The codec for this link's next contribution: the policy's, if the agent has it."""
        wanted = self.links.codec(session)
        return wanted if not session.codecs or wanted in session.codecs else "fp32"

    def _downlink_codec(self) -> str:
        names = [s.codec for s in self.sessions.values()] or [self.links.start_codec]
        return max(names, key=lambda n: CODEC_WEIGHT.get(n, 0))

    def _expire_silent(self) -> None:
        now = time.monotonic()
        for s in list(self.sessions.values()):
            if now - s.last_seen > self.config.liveness_timeout_s:
                log.warning(
                    "[Coordinator.Liveness] agent=%s silent_s=%.1f", s.key, now - s.last_seen
                )
                self._forget(s)
                self.links.close(s)
                del self.sessions[s.key]
                s.close(
                    grpc.StatusCode.UNAVAILABLE,
                    f"no message for {self.config.liveness_timeout_s} s",
                )

    # ---- status --------------------------------------------------------------------------

    def status(self, windows: bool = False) -> pb.StatusReply:
        """Who is connected and how, the recent rounds; ``windows`` adds raw link samples."""
        now = time.monotonic()
        with self.cond:
            agents = [
                pb.AgentStatus(
                    cloud=s.identity.cloud or "",
                    name=s.identity.name,
                    state=s.state,
                    last_round=s.last_round,
                    codec=s.codec,
                    rtt_ms=s.rtt_ms,
                    bytes_up=s.bytes_up,
                    bytes_down=s.bytes_down,
                    connected_s=now - s.joined_at,
                    codec_switches=s.codec_switches,
                    refused=s.refused,
                    loss_pct=s.loss_pct,
                    jitter_ms=s.jitter_ms,
                    goodput_mbit=s.goodput_mbit,
                    windows=self._windows(s) if windows else (),
                )
                for s in self.sessions.values()
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
                for r in self.history
            ]
            return pb.StatusReply(
                round=self.round,
                agents=agents,
                weights_digest=self.weights_digest,
                uptime_s=now - self.started_at,
                rounds=rounds,
                finished=self.finished,
                exchange=self.config.exchange,
            )

    def _windows(self, session: Session) -> list[pb.LinkWindow]:
        link = self.links.get(session)
        if link is None:
            return []
        return [
            pb.LinkWindow(
                start_s=w.start_s,
                rtt_ms=w.rtt_ms,
                jitter_ms=w.jitter_ms,
                probes=w.probes,
                probes_lost=w.probes_lost,
                goodput_mbit=w.goodput_mbit,
            )
            for w in link.monitor.window_log
        ]

    def write_status(self) -> None:
        """Status as JSON, atomically, for operators' scripts and the demo's summary."""
        path = self.config.status_file
        if path is None:
            return
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(
            json_format.MessageToJson(self.status(), always_print_fields_with_no_presence=True)
        )
        os.replace(tmp, path)

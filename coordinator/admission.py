"""Admission: a hello checked against the certificate and the model; welcome, resync, leave.

A member whose weights are behind (a late join, a reconnect that missed a round) gets the
current weights right after its welcome, so every member starts the open round from the
same bytes.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from typing import TYPE_CHECKING

import grpc

from skyfed.certs.identity import Identity
from skyfed.compression import frame
from skyfed.coordinator.outer import long_phase_refusal
from skyfed.errors import (
    IdentityMismatchError,
    ModelMismatchError,
    NoSessionError,
    ProtocolError,
    UnsupportedDigestError,
    UnsupportedExchangeError,
    UnsupportedFrameError,
    UnsupportedOuterError,
)
from skyfed.fingerprint import DIGEST_PREFIX, describe_mismatch, is_weights_digest
from skyfed.netinfo import CongestionControl
from skyfed.proto.chunks import cut_all
from skyfed.wire import (
    ChunkKind,
    CoordinatorMessage,
    Hello,
    Payload,
    ProbeOffer,
    WeightsEnd,
    Welcome,
)

if TYPE_CHECKING:
    from skyfed.coordinator.federation import Federation
    from skyfed.coordinator.session import Session

log = logging.getLogger(__name__)

STRIPE_TOKEN_BYTES = 16


class Admission:
    """Who is a member of ``fed``: joins, leaves, replacements and the silent."""

    def __init__(self, fed: Federation) -> None:
        self.fed = fed
        self.sessions: dict[str, Session] = {}
        """The members' live sessions, by identity URI."""
        self.revoked: dict[str, Session] = {}
        """Sessions ended by revocation, kept for status (state ``revoked``)."""
        self.down: dict[str, Session] = {}
        """Sites that went down saying why (``Leave``), kept for status (state ``down``,
        their ``last_error``) until they are back."""

    def check(self, session: Session, hello: Hello) -> None:
        """Raise unless ``hello`` agrees with the session's certificate and the model."""
        fed, ident = self.fed, session.identity
        if ident.role != "agent":
            raise IdentityMismatchError(f"certificate {ident.uri} is not an agent's")
        if (hello.cloud, hello.name) != (ident.cloud, ident.name):
            raise IdentityMismatchError(
                f"hello claims cloud={hello.cloud!r} name={hello.name!r} but the certificate "
                f"says cloud={ident.cloud!r} name={ident.name!r}"
            )
        if hello.tensors != fed.model.spec:
            raise ModelMismatchError(
                f"model fingerprint differs from the federation's ({fed.config.task}, "
                f"{fed.model.spec_digest}): {describe_mismatch(fed.model.spec, hello.tensors)}"
            )
        digest = hello.weights_digest
        if digest and not is_weights_digest(digest):  # resyncing would never match
            raise UnsupportedDigestError(
                f"the agent's weights digest is from before {DIGEST_PREFIX!r} (a sha256 tree); "
                f"this coordinator compares the {DIGEST_PREFIX!r} crc32 tree: upgrade the agent"
            )
        if hello.frame_version != frame.VERSION:  # every payload either way would be refused
            raise UnsupportedFrameError(
                f"the agent speaks payload frames version {hello.frame_version or 1}; this "
                f"coordinator speaks version {frame.VERSION}: run the same skyfed on both"
            )
        rounds = fed.config.rounds
        why = long_phase_refusal(
            rounds.outer_optimizer, rounds.outer_lr, rounds.outer_momentum, hello.local_steps
        )
        if why is not None:
            raise UnsupportedOuterError(why)
        offered = list(hello.exchanges) or ["delta"]  # agents from before the field
        if rounds.exchange not in offered:
            raise UnsupportedExchangeError(
                f"this federation exchanges {fed.config.rounds.exchange!r}; the agent offers "
                f"{offered} (upgrade it)"
            )

    def join(self, session: Session, hello: Hello) -> None:
        """Check a hello; welcome the session (with the weights if it is behind) or raise."""
        if session.state != "connecting":  # only the session's own reader changes it
            raise ProtocolError("a second hello on one session (open a new session instead)")
        self.check(session, hello)
        fed = self.fed
        with fed.cond:
            self._replace_existing(session)
            session.codecs = frozenset(hello.codecs)
            session.local_steps = hello.local_steps
            if hello.congestion_control:  # an agent from before the field says nothing
                session.agent_cc = CongestionControl(name=hello.congestion_control, source="agent")
            fed.links.open(session, fed.model.round)
            session.tp = max(1, hello.tp)
            session.dp = hello.dp
            was_down = self.down.pop(session.key, None)
            session.last_error = hello.last_error or (was_down.last_error if was_down else "")
            if hello.last_error:
                log.warning(
                    "[Coordinator.Join] agent=%s last stopped: %s", session.key, hello.last_error
                )
            self._offer_stripes(session, hello)
            behind = (
                fed.rounds.finished  # the final weights follow, and tell it to stop
                or hello.last_round != fed.model.round - 1
                or hello.weights_digest != fed.model.weights_digest
            )
            self.sessions[session.key] = session
            session.state = "syncing" if behind else "idle"
            session.send(self._welcome(session, behind))
            if behind:
                for message in self.weights_messages():
                    session.send(message)
            if fed.rounds.finished:
                fed.rounds.final_delivered.add(session.key)
            session.state = "idle"
            log.info(
                "[Coordinator.Join] agent=%s round=%d resync=%s codec=%s params=%s dp=%d "
                "tp=%d local_steps=%d cc=%s agent_cc=%s",
                session.identity.uri,
                fed.model.round,
                behind,
                session.codec,
                fed.links.codec_params(session, fed.model.round) or "{}",
                session.dp,
                session.tp,
                session.local_steps,
                session.cc.name if session.cc else "unknown",
                session.agent_cc.name if session.agent_cc else "unknown",
            )
            fed.cond.notify_all()

    def _replace_existing(self, session: Session) -> None:
        old = self.sessions.get(session.key)
        if old is not None and old is not session:
            self.forget(old)
            old.close(grpc.StatusCode.ABORTED, "replaced by a newer session of the same identity")

    def _offer_stripes(self, session: Session, hello: Hello) -> None:
        """Let the session stripe if both ends can: a join token, and positions on every
        message from the welcome on (``docs/striping.md``). The caller holds the lock."""
        offered = min(hello.max_streams, self.fed.config.streams.max_streams)
        if offered <= 1:
            return
        session.max_streams = offered
        session.stripe_token = secrets.token_bytes(STRIPE_TOKEN_BYTES)
        session.outbox.start_striping()
        link = self.fed.links.get(session)
        wanted = link.streams.streams if link is not None else 1
        session.streams = max(1, min(wanted, offered))

    def stripe(self, identity: Identity, token: bytes) -> Session:
        """The live session a Stripe call joins: its certificate's own identity's, holding
        ``token``; anything else is refused (compared in constant time)."""
        own = self.sessions.get(identity.uri)
        if own is not None and own.stripe_token and hmac.compare_digest(own.stripe_token, token):
            if own.closed:
                raise NoSessionError(f"the session of {identity.uri} has ended: reconnect")
            return own
        others = [s for s in self.sessions.values() if s is not own and s.stripe_token]
        if any(hmac.compare_digest(s.stripe_token, token) for s in others):
            raise IdentityMismatchError(
                f"certificate {identity.uri} presents the stripe token of another agent's session"
            )
        raise NoSessionError(
            f"no session of {identity.uri} holds this stripe token (it ended or was replaced)"
        )

    def _welcome(self, session: Session, weights_follow: bool) -> Welcome:
        fed = self.fed
        probe = None
        link = fed.links.get(session)
        if fed.links.echo is not None and link is not None and link.probe is not None:
            probe = ProbeOffer(
                port=fed.links.echo.port,
                key=link.probe.key,
                probe_id=link.probe.probe_id,
                interval_ms=fed.config.transport.probe_interval_ms,
            )
        return Welcome(
            round=fed.model.round,
            weights_follow=weights_follow,
            codec=session.codec,
            codec_params=fed.links.codec_params(session, fed.model.round),
            max_chunk_bytes=fed.config.transport.max_chunk_bytes,
            heartbeat_ms=fed.config.transport.heartbeat_ms,
            identity=session.identity.uri,
            exchange=fed.config.rounds.exchange,
            sgd_lr=fed.config.rounds.sgd_lr,
            sgd_momentum=fed.config.rounds.sgd_momentum,
            probe=probe,
            overlap=fed.config.rounds.overlap,
            stripe_token=session.stripe_token,
            streams=session.streams if session.stripe_token else 0,
            term=fed.term,
        )

    def weights_messages(self) -> list[CoordinatorMessage]:
        """The current weights as FP32 chunks and their end: a member's resync."""
        fed = self.fed
        payloads = [
            Payload(i, None, "fp32", data) for i, data in enumerate(fed.model.weights_payloads())
        ]
        chunks = cut_all(
            payloads,
            kind=ChunkKind.WEIGHTS,
            round=fed.model.round - 1,
            max_chunk_bytes=fed.config.transport.max_chunk_bytes,
            term=fed.term,
        )
        end = WeightsEnd(
            round=fed.model.round - 1,
            chunks=len(chunks),
            weights_digest=fed.model.weights_digest,
            final=fed.rounds.finished,
            term=fed.term,
        )
        return [*chunks, end]

    def leave(self, session: Session) -> None:
        fed = self.fed
        with fed.cond:
            if self.sessions.get(session.key) is session:
                self.forget(session)
                fed.links.close(session)
                del self.sessions[session.key]
                log.info("[Coordinator.Leave] agent=%s round=%d", session.key, fed.model.round)
            fed.cond.notify_all()

    def left(self, session: Session, reason: str) -> None:
        """The site says it goes down, and why: it leaves now, and status shows it as
        ``down`` with ``reason`` until it is back (docs/sites.md)."""
        log.warning("[Coordinator.Leave] agent=%s down: %s", session.key, reason)
        self.leave(session)
        with self.fed.cond:
            session.state, session.last_error = "down", reason
            self.down[session.key] = session
        session.close()  # what is queued goes, then the stream ends: the site is gone

    def revoke(self, session: Session, reason: str) -> None:
        """End a revoked identity's stream: its contribution in flight is withdrawn, status
        lists it as ``revoked``, and the stream ends with UNAUTHENTICATED."""
        fed = self.fed
        with fed.cond:
            if self.sessions.get(session.key) is session:
                self.forget(session)
                fed.links.close(session)
                del self.sessions[session.key]
                session.state = "revoked"
                self.revoked[session.key] = session
            fed.cond.notify_all()
        session.close(grpc.StatusCode.UNAUTHENTICATED, reason)

    def forget(self, session: Session) -> None:
        """Withdraw whatever the session had half-sent; it never reaches the aggregate."""
        if session.inbound is not None:
            session.inbound.withdraw()
        session.inbound = None
        session.state = "disconnected"

    def require_member(self, session: Session) -> None:
        if self.sessions.get(session.key) is not session:
            raise ProtocolError("send hello first")

    def expire_silent(self) -> None:
        """Drop members silent for longer than ``liveness_timeout_s``; the caller holds the lock."""
        fed = self.fed
        now = time.monotonic()
        for s in list(self.sessions.values()):
            if now - s.last_seen > fed.config.transport.liveness_timeout_s:
                log.warning(
                    "[Coordinator.Liveness] agent=%s silent_s=%.1f", s.key, now - s.last_seen
                )
                self.forget(s)
                fed.links.close(s)
                del self.sessions[s.key]
                s.close(
                    grpc.StatusCode.UNAVAILABLE,
                    f"no message for {fed.config.transport.liveness_timeout_s} s",
                )

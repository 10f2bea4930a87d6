"""What one identity may hold open: a bounded number of calls of every kind, of session
streams among them, and a hello due soon on each session.

Without these, 254 streams of one certificate that never say hello filled the server's
RPC limit and locked every other agent (and ``Status``) out; so did 256 ``Stripe`` calls
that never joined. Every call is counted here from the moment it opens, before its first
message (``coordinator/calls.py`` does the counting). See docs/security.md, "Call and
stream limits".
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

import grpc

from skyfed.coordinator.session import Session
from skyfed.errors import TooManyStreamsError
from skyfed.logs import Throttle

log = logging.getLogger(__name__)

SESSION = "/skyfed.v1.Federation/Session"
"""The method whose calls are session streams (``max_streams_per_identity``)."""

OTHER_CALLS = 4
"""Calls besides sessions and stripes one identity may hold at once (``Status``, health)."""


def stripes_allowed(max_streams: int) -> int:
    """Stripe connections one session may hold: its ``max_streams - 1`` lanes, each with
    room for a redial that overlaps its dying connection (as ``max_streams_per_identity``
    leaves room for a reconnect)."""
    return 2 * (max_streams - 1)


def calls_allowed(per_identity: int, max_streams: int, server_calls: int) -> int:
    """Calls of every kind one identity may hold open at once: its session streams (a
    reconnect overlaps the old one), one striped session's stripes and a few other calls;
    never over a quarter of the ``server_calls`` the server serves at once, so that one
    certificate cannot take them all."""
    wanted = per_identity + stripes_allowed(max_streams) + OTHER_CALLS
    return min(wanted, server_calls // 4)


class CallLimits:
    """Counts open calls per identity (its SPIFFE URI): all of them against ``per_identity``,
    session streams against ``sessions``."""

    def __init__(self, per_identity: int, sessions: int) -> None:
        self.per_identity = per_identity
        self.sessions = sessions
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._sessions: Counter[str] = Counter()
        self._refusals = Throttle(interval_s=10.0)

    def admit(self, key: str, method: str) -> None:
        """Count a call that just opened, or raise TooManyStreamsError (RESOURCE_EXHAUSTED)."""
        with self._lock:
            if self._calls[key] >= self.per_identity:
                self._refuse(key, self._calls[key], "open calls", "calls_per_identity")
            if method == SESSION and self._sessions[key] >= self.sessions:
                self._refuse(key, self._sessions[key], "open streams", "max_streams_per_identity")
            self._calls[key] += 1
            if method == SESSION:
                self._sessions[key] += 1

    def release(self, key: str, method: str) -> None:
        with self._lock:
            self._calls[key] -= 1
            if self._calls[key] <= 0:
                del self._calls[key]
            if method == SESSION:
                self._sessions[key] -= 1
                if self._sessions[key] <= 0:
                    del self._sessions[key]

    def _refuse(self, key: str, held: int, what: str, option: str) -> None:
        limit = self.per_identity if option == "calls_per_identity" else self.sessions
        if self._refusals.ready(f"{key}:{option}"):
            log.warning(
                "[Coordinator.Limits] agent=%s refused: holds %d %s (%s=%d)",
                key,
                held,
                what,
                option,
                limit,
            )
        raise TooManyStreamsError(
            f"{key} already holds {held} {what}, the most one identity may "
            f"({option}={limit}); close one first"
        )


def hello_due(session: Session, timeout_s: float) -> None:
    """End ``session`` with DEADLINE_EXCEEDED unless it has said hello ``timeout_s`` from now
    (its first message may be a heartbeat; the hello must follow)."""
    timer = threading.Timer(timeout_s, _hello_due, args=(session, timeout_s))
    timer.daemon = True
    timer.start()


def _hello_due(session: Session, timeout_s: float) -> None:
    if session.state == "connecting" and not session.closed:
        log.warning(
            "[Coordinator.Limits] agent=%s peer=%s sent no hello within %.1f s",
            session.key,
            session.peer,
            timeout_s,
        )
        session.close(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"no hello within hello_timeout_s={timeout_s} s of opening the stream",
        )

"""What one identity may hold open: a bounded number of streams, each owing a hello soon.

Without these, 254 streams of one certificate that never say hello filled the server's
RPC limit and locked every other agent (and ``Status``) out. Each open stream is
registered here with the serial of its certificate, so the revocation watch
(``coordinator/revocation.py``) can end the streams of a revoked identity. See
docs/security.md, "Stream limits".
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import grpc

from skyfed.coordinator.session import Session
from skyfed.errors import TooManyStreamsError
from skyfed.logs import Throttle

log = logging.getLogger(__name__)


def stripes_allowed(max_streams: int) -> int:
    """Stripe connections one session may hold: its ``max_streams - 1`` lanes, each with
    room for a redial that overlaps its dying connection (as ``max_streams_per_identity``
    leaves room for a reconnect). Stripes do not count as streams of their own, so this
    bound is what keeps one certificate from filling the server's RPC slots with them."""
    return 2 * (max_streams - 1)


@dataclass(eq=False, slots=True)
class Stream:
    """One open call: its session, and the certificate serial it authenticated with."""

    session: Session
    serial: int


class StreamLimits:
    """Counts open streams per identity (``Session.key``) and ends those that owe a hello."""

    def __init__(self, per_identity: int, hello_timeout_s: float) -> None:
        self.per_identity = per_identity
        self.hello_timeout_s = hello_timeout_s
        self._lock = threading.Lock()
        self._open: dict[str, list[Stream]] = {}
        self._refusals = Throttle(interval_s=10.0)

    def open(self, session: Session, serial: int) -> Stream:
        """Register a new stream, or raise TooManyStreamsError (RESOURCE_EXHAUSTED).

        Only ``Session`` streams are registered: a striped session's further connections
        (the ``Stripe`` RPC) join it by its token and count with it, once."""
        key = session.key
        with self._lock:
            streams = self._open.setdefault(key, [])
            if len(streams) >= self.per_identity:
                if self._refusals.ready(key):
                    log.warning(
                        "[Coordinator.Limits] agent=%s refused: holds %d streams "
                        "(max_streams_per_identity=%d)",
                        key,
                        len(streams),
                        self.per_identity,
                    )
                raise TooManyStreamsError(
                    f"{key} already holds {len(streams)} open streams, the most one identity "
                    f"may (max_streams_per_identity={self.per_identity}); close one first"
                )
            stream = Stream(session, serial)
            streams.append(stream)
        timer = threading.Timer(self.hello_timeout_s, self._hello_due, args=(session,))
        timer.daemon = True
        timer.start()
        return stream

    def close(self, stream: Stream) -> None:
        with self._lock:
            streams = self._open.get(stream.session.key, [])
            if stream in streams:
                streams.remove(stream)
            if not streams:
                self._open.pop(stream.session.key, None)

    def streams(self) -> list[Stream]:
        """Every open stream (a snapshot)."""
        with self._lock:
            return [s for streams in self._open.values() for s in streams]

    def _hello_due(self, session: Session) -> None:
        if session.state == "connecting" and not session.closed:
            log.warning(
                "[Coordinator.Limits] agent=%s peer=%s sent no hello within %.1f s",
                session.key,
                session.peer,
                self.hello_timeout_s,
            )
            session.close(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no hello within hello_timeout_s={self.hello_timeout_s} s of opening the stream",
            )

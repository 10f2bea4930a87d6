"""The agent's further connections of a striped session: one TLS channel and Stripe call each.

Each lane dials its own channel with its own subchannel pool, so it really is its own TCP
connection (gRPC otherwise shares one connection between channels with the same target
and arguments, and HTTP/2 streams on one connection share its one congestion window).
Each presents the agent's certificate and the welcome's join token; after that it
carries chunks both ways. A lane that ends gives its unacknowledged chunks back to the
session's other lanes (``proto/stripes.py``); the session goes on (``docs/striping.md``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
from google.protobuf.message import Message

from skyfed.netinfo import log_send_buffering
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import serde
from skyfed.proto.outbox import StripeLane
from skyfed.proto.stripes import Merge

log = logging.getLogger(__name__)

READY_WAIT_S = 5.0
"""How long a contribution waits at most for the lanes opened at the last resize to
connect (TCP, TLS and HTTP/2: two or three round trips); a lane still connecting then
carries its share once it is up."""


@dataclass
class _Open:
    lane: StripeLane
    channel: grpc.Channel
    call: grpc.Call
    reader: threading.Thread


class Stripes:
    """The lanes of one session beyond its primary call, kept at the count the coordinator
    names (:meth:`resize`).

    ``dial`` opens a channel on a TCP connection of its own; ``open_lane`` gives the next
    lane of the session's outbox to send on; what a lane receives goes to ``merge``; a
    lane whose peer breaks the protocol calls ``fail`` (which ends the session).
    """

    def __init__(
        self,
        dial: Callable[[], grpc.Channel],
        open_lane: Callable[[], StripeLane],
        merge: Merge,
        token: bytes,
        fail: Callable[[grpc.StatusCode, str], None],
    ) -> None:
        self.dial, self.open_lane, self.merge, self.token = dial, open_lane, merge, token
        self.fail = fail
        self._lock = threading.Lock()
        self._open: dict[int, _Open] = {}
        self._connecting: dict[int, grpc.Future] = {}
        """Lanes opened since the last :meth:`wait_ready`: the futures of their channels'
        connections."""
        self._closed = False
        self._buffers_checked = False
        self.ended = 0
        """Lanes that ended under the session (a connection that died)."""

    @property
    def streams(self) -> int:
        """Connections the session stripes over now, the primary included."""
        with self._lock:
            return 1 + len(self._open)

    def resize(self, streams: int) -> None:
        """Open or close lanes until the session stripes over ``streams`` connections."""
        with self._lock:
            if self._closed or 1 + len(self._open) == max(1, streams):
                return
            if streams > 1 and not self._buffers_checked:  # once, at the first striping
                self._buffers_checked = True
                log_send_buffering("agent", striping=True)
            while 1 + len(self._open) < streams:
                self._start()
            while 1 + len(self._open) > max(1, streams):
                index = max(self._open)
                self._open.pop(index).lane.end()  # its stream ends; what it held goes on
        log.info("[Agent.Stripe] streams=%d", streams)

    def wait_ready(self, timeout_s: float = READY_WAIT_S) -> None:
        """Wait (up to ``timeout_s``) until the lanes opened since the last call are
        connected. A lane takes one chunk before its connection is up and no more, while
        the primary's transport takes chunks as fast as its windows and socket buffers
        let it: a transfer that starts right after a resize otherwise went almost whole
        on the primary, at one stream's rate (docs/striping.md)."""
        with self._lock:
            connecting, self._connecting = self._connecting, {}
        if not connecting:
            return
        started, late = time.monotonic(), 0
        for index, ready in connecting.items():
            with self._lock:
                if index not in self._open:
                    continue  # ended meanwhile: nothing to wait for
            try:
                ready.result(timeout=max(0.0, started + timeout_s - time.monotonic()))
            except grpc.FutureTimeoutError:
                late += 1
        log.info(
            "[Agent.Stripe] lanes=%d connected=%d wait_s=%.2f",
            len(connecting),
            len(connecting) - late,
            time.monotonic() - started,
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            lanes, self._open = list(self._open.values()), {}
            connecting, self._connecting = list(self._connecting.values()), {}
        for ready in connecting:
            ready.cancel()
        for each in lanes:
            each.lane.end()
            each.call.cancel()
            each.channel.close()

    def _start(self) -> None:
        lane = self.open_lane()
        channel = self.dial()
        call = serde.agent_stream(channel, "Stripe")(self._requests(lane))
        reader = threading.Thread(
            target=self._read, args=(lane.index, call), name=f"stripe-{lane.index}", daemon=True
        )
        self._open[lane.index] = _Open(lane, channel, call, reader)
        self._connecting[lane.index] = grpc.channel_ready_future(channel)
        reader.start()

    def _requests(self, lane: StripeLane) -> Iterator[Message | serde.Serialized]:
        yield pb.AgentMessage(stripe_join=pb.StripeJoin(token=self.token))
        yield from lane

    def _read(self, index: int, call: grpc.Call) -> None:
        try:
            for message in call:
                self.merge.add(message.order, message, message.ByteSize())
            why = "the coordinator closed it"
        except grpc.RpcError as exc:
            why = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # a broken stream from the coordinator ends the session
            log.warning("[Agent.Stripe] lane=%d: %s", index, exc)
            self.fail(grpc.StatusCode.INTERNAL, f"stripe {index}: {exc}")
            why = str(exc)
        self._lost(index, why)

    def _lost(self, index: int, why: str) -> None:
        with self._lock:
            each = self._open.pop(index, None)
        if each is None:
            return  # closed or resized away on purpose
        each.lane.end()
        each.channel.close()
        self.ended += 1
        log.warning(
            "[Agent.Stripe] lane=%d ended (%s); the session goes on over %d connection(s)",
            index,
            why,
            self.streams,
        )

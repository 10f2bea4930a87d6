"""The sending side of one session stream: messages in order, heartbeats ahead of chunks."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator

from google.protobuf.message import Message


class Outbox:
    """Messages waiting for one gRPC stream. Heartbeats overtake what is queued; every
    other message keeps its order.

    gRPC's synchronous streams send one message at a time and take the next only when the
    transport has accepted the last, which on a slow link is when flow control lets it go.
    In one queue a heartbeat, with the loss counts it carries, waited behind every chunk of
    the transfer in progress: 100 MB of FP16 gradients on a 20 Mbit/s link would leave the
    coordinator's monitor without them for 40 s. Now it waits for what gRPC and the socket
    already hold (6-8 of 40 queued 1 MB chunks on loopback, where it waited for all 40;
    ``tests/monitor/test_monitor_heartbeats.py``). TCP still delivers in order: on a lossy
    link a heartbeat waits out the retransmission of the bytes ahead of it, which is why
    round trips travel on the probe instead (``coordinator/probe.py``). Overtaking is safe:
    heartbeats carry measurements, nothing a chunk or a round message depends on.
    """

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._beats: deque[Message] = deque()
        self._queued: deque[Message] = deque()
        self._closed = False

    def put(self, message: Message) -> None:
        """Queue ``message`` (an ``AgentMessage`` or ``CoordinatorMessage``); once the
        outbox is closed, drop it."""
        with self._ready:
            if self._closed:
                return
            heartbeat = message.WhichOneof("body") == "heartbeat"
            (self._beats if heartbeat else self._queued).append(message)
            self._ready.notify()

    def close(self) -> None:
        """End the stream once what is queued has been sent."""
        with self._ready:
            self._closed = True
            self._ready.notify()

    def __iter__(self) -> Iterator[Message]:
        """The messages in sending order, until the outbox is closed and empty (the
        request or response iterator that gRPC drains)."""
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._beats or self._queued or self._closed)
                if self._beats:
                    message = self._beats.popleft()
                elif self._queued:
                    message = self._queued.popleft()
                else:
                    return
            yield message

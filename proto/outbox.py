"""The sending side of one session: messages in order, heartbeats ahead of chunks, and the
lanes of a striped session (``proto/stripes.py``)."""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.message import Message

from skyfed.proto.serde import Serialized, numbered
from skyfed.proto.stripes import Kind, Lane, Spread

KINDS = {"heartbeat": Kind.BEAT, "chunk": Kind.CHUNK}
"""How each message body travels; every other body is a control message."""


class Outbox:
    """Messages waiting for one session's streams. Heartbeats overtake what is queued;
    every other message keeps its order.

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

    Iterating the outbox drains its primary lane. Once :meth:`start_striping` is called,
    every message but a heartbeat carries its position in ``order``, and :meth:`stripe`
    opens further lanes that carry chunks (``docs/striping.md``).
    """

    def __init__(self) -> None:
        self.spread: Spread[Message | Serialized] = Spread(ordered=False)
        self._primary = self.spread.lane(primary=True)

    def put(self, message: Message | Serialized) -> None:
        """Queue ``message`` (an ``AgentMessage`` or ``CoordinatorMessage``, owned by this
        outbox from now on, or a message serialized once for several outboxes); once the
        outbox is closed, drop it."""
        body = message.body if isinstance(message, Serialized) else message.WhichOneof("body")
        self.spread.put(message, KINDS.get(body, Kind.CONTROL))

    def start_striping(self) -> None:
        """Number every message put from now on: the session may stripe."""
        self.spread.start_ordering()

    def acked(self, position: int) -> None:
        """The peer holds every position up to ``position`` (its heartbeat's ``received``)."""
        self.spread.acked(position)

    def stripe(self) -> StripeLane:
        """A further lane: the chunks one more connection sends."""
        return StripeLane(self.spread.lane())

    def close(self) -> None:
        """End the streams once what is queued has been sent."""
        self.spread.close()

    def __iter__(self) -> Iterator[Message | Serialized]:
        """The primary lane's messages in sending order, until the outbox is closed and
        empty (the request or response iterator that gRPC drains)."""
        return _stamped(self._primary)


class StripeLane:
    """One further connection's share of an outbox: iterate it for the messages to send;
    :meth:`end` when the connection ends, so its unacknowledged chunks go on the others."""

    def __init__(self, lane: Lane[Message | Serialized]) -> None:
        self.lane = lane
        self.index = lane.index

    def __iter__(self) -> Iterator[Message | Serialized]:
        return _stamped(self.lane)

    def end(self) -> None:
        self.lane.end()


def _stamped(lane: Lane[Message | Serialized]) -> Iterator[Message | Serialized]:
    for position, message in lane:
        if position and isinstance(message, Serialized):
            message = numbered(message, position)  # shared: stamp a copy
        elif position and not isinstance(message, Serialized):
            message.order = position
        yield message

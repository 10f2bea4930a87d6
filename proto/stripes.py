"""One session's messages over N connections: spread them when sending, merge them when receiving.

A single CUBIC connection on a long lossy path is held to MSS / RTT x 1.22 / sqrt(p) (Mathis),
whatever the path's rate; N connections hold N times that (``docs/striping.md``). The
session stays one logical stream: every ordered message gets the next position (1, 2, 3,
...), control messages travel on the primary connection only, chunks on whichever
connection asks for the next message first (a faster connection takes more), and the
receiver releases messages strictly by position, each position once. It therefore sees
exactly the message sequence one connection would have delivered, whatever connection
carried what and whatever was sent twice.

Nothing here knows protobuf: items are opaque, positions travel in a field the edges
(the servicer and the agent's link) set and read.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Generic, TypeVar

from skyfed.errors import ProtocolError

T = TypeVar("T")

UNORDERED = 0
"""The position of a message outside the session's order: heartbeats, which overtake
whatever is queued, carry measurements only, and are never sent twice."""
PRIMARY = 0
"""The lane of the session's first connection: the only one that carries control messages."""


class Kind(Enum):
    """How a message travels."""

    BEAT = "beat"
    """First on the primary lane, unordered, never resent."""
    CONTROL = "control"
    """Ordered, on the primary lane only: if that connection ends, so does the session."""
    CHUNK = "chunk"
    """Ordered, on any lane; resent on another lane when its own ends before the peer
    acknowledged it."""


class Spread(Generic[T]):
    """The sending side of one session: a queue per kind that ``lane(i)`` iterators drain.

    Invariants: ordered messages get positions 1, 2, 3, ... in the order they were put;
    a chunk a lane took is retained until the peer acknowledges its position (:meth:`acked`,
    the receiver's :attr:`Merge.received`, which rides on heartbeats); when a lane ends
    (:meth:`end_lane`), its retained chunks go back to the queue, lowest position first,
    for the lanes still open. Lanes take the lowest queued position, so the receiver
    holds as little as possible out of order.

    With ``ordered=False`` (until :meth:`start_ordering`) every position is
    :data:`UNORDERED` and only the primary lane runs: one plain stream whose heartbeats
    overtake, the N = 1 path of a session that does not stripe.
    """

    def __init__(self, *, ordered: bool = True) -> None:
        self.ordered = ordered
        self._ready = threading.Condition()
        self._beats: deque[T] = deque()
        self._control: deque[tuple[int, T]] = deque()
        self._chunks: list[tuple[int, int, T]] = []  # heap of (position, tiebreak, item)
        self._retained: dict[int, dict[int, T]] = {}  # lane -> position -> chunk
        self._live: set[int] = set()
        self._next_lane = PRIMARY + 1
        self._position = 0
        self._acked = 0
        self._closed = False
        self.resent = 0
        """Chunks given back to the queue by lanes that ended before their acknowledgement."""

    def start_ordering(self) -> None:
        """Give every message put from now on a position: the session stripes (a welcome
        with a join token). Messages queued before keep :data:`UNORDERED`; they are sent
        on the primary lane ahead of the ordered ones, so the receiver, which delivers
        unordered messages at once, still sees them first."""
        with self._ready:
            self.ordered = True

    @property
    def lanes(self) -> int:
        """Lanes open now."""
        with self._ready:
            return len(self._live)

    def put(self, item: T, kind: Kind) -> int:
        """Queue ``item``; its position (:data:`UNORDERED` for a heartbeat or an unordered
        spread). Once the spread is closed, drop it."""
        with self._ready:
            if self._closed:
                return UNORDERED
            if kind is Kind.BEAT:
                self._beats.append(item)
                self._ready.notify_all()
                return UNORDERED
            position = UNORDERED
            if self.ordered:
                self._position += 1
                position = self._position
            if kind is Kind.CONTROL or not self.ordered:
                self._control.append((position, item))
                self._ready.notify_all()  # the primary must wake
            else:
                heapq.heappush(self._chunks, (position, position, item))
                self._ready.notify()  # any one lane can take it (16 waking per chunk cost CPU)
            return position

    def acked(self, position: int) -> None:
        """The peer holds every position up to ``position``: forget those chunks."""
        with self._ready:
            if position <= self._acked:
                return
            self._acked = position
            for held in self._retained.values():
                for p in [p for p in held if p <= position]:
                    del held[p]

    def lane(self, *, primary: bool = False) -> Lane[T]:
        """A new lane to send on; the primary one also sends heartbeats and control
        messages, heartbeats first. A lane's id is never reused, so an iterator left over
        from a dead connection can never take another lane's messages."""
        with self._ready:
            if primary and PRIMARY in self._retained:
                raise ValueError("the spread already has its primary lane")
            if not primary and not self.ordered:
                raise ValueError("an unordered spread has only its primary lane")
            index = PRIMARY if primary else self._next_lane
            if not primary:
                self._next_lane += 1
            self._live.add(index)
            self._retained[index] = {}
        return Lane(self, index)

    def _drain(self, index: int) -> Iterator[tuple[int, T]]:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._has_work(index))
                if index not in self._live:
                    self._ready.notify()  # a chunk's wake-up may have been meant for us
                    return
                taken = self._take(index)
                if taken is None:
                    self._live.discard(index)
                    return  # closed and drained
            yield taken

    def _has_work(self, index: int) -> bool:
        if index not in self._live or self._closed or self._chunks:
            return True
        return index == PRIMARY and bool(self._beats or self._control)

    def _take(self, index: int) -> tuple[int, T] | None:
        """The next message for lane ``index`` (under the lock); None once closed and drained."""
        if index == PRIMARY and self._beats:
            return UNORDERED, self._beats.popleft()
        if index == PRIMARY and self._control:
            return self._control.popleft()
        if self._chunks:
            position, _, item = heapq.heappop(self._chunks)
            if position > self._acked:
                self._retained[index][position] = item
            return position, item
        return None

    def _end(self, index: int) -> None:
        """Lane ``index`` ended (its connection died or was closed): its chunks the peer
        has not acknowledged go back to the queue for the other lanes."""
        with self._ready:
            self._live.discard(index)
            held = self._retained.get(index, {})
            self._retained[index] = {}
            for position, item in held.items():
                if position > self._acked:
                    heapq.heappush(self._chunks, (position, position, item))
                    self.resent += 1
            self._ready.notify_all()

    def close(self) -> None:
        """End every lane once what is queued has been sent."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()


class Lane(Generic[T]):
    """One connection's share of a spread: iterate it to get ``(position, item)`` to send."""

    def __init__(self, spread: Spread[T], index: int) -> None:
        self.spread = spread
        self.index = index

    @property
    def primary(self) -> bool:
        return self.index == PRIMARY

    def __iter__(self) -> Iterator[tuple[int, T]]:
        """What to send, until the spread is closed and drained or the lane is ended."""
        return self.spread._drain(self.index)

    def poll(self) -> tuple[int, T] | None:
        """The next ``(position, item)`` to send if one is there now, without waiting."""
        with self.spread._ready:
            if self.index not in self.spread._live:
                return None
            return self.spread._take(self.index)

    def end(self) -> None:
        """The lane's connection ended (died or was closed): the chunks it took that the
        peer has not acknowledged go back to the queue for the other lanes."""
        self.spread._end(self.index)


class Merge(Generic[T]):
    """The receiving side of one session: messages from every lane, delivered in position order.

    :meth:`add` may be called from one thread per lane; ``deliver`` is called under the
    merge's lock, so messages reach it one at a time, in the order they were put, each
    position exactly once (a copy that arrives after its resend, or twice, is dropped).
    Messages that arrive ahead of a missing position wait, up to ``max_held_bytes``:
    beyond it the peer is refused (a connection that stalls holds back at most one
    transfer, which the bound must cover).
    """

    def __init__(self, deliver: Callable[[T], None], *, max_held_bytes: int) -> None:
        if max_held_bytes < 1:
            raise ValueError(f"max_held_bytes must be positive, got {max_held_bytes}")
        self.deliver = deliver
        self.max_held_bytes = max_held_bytes
        self._lock = threading.RLock()  # ``deliver`` may read ``received``
        self._held: dict[int, tuple[T, int]] = {}
        self._held_bytes = 0
        self._received = 0
        self.duplicates = 0
        """Messages dropped because their position had already arrived."""

    @property
    def received(self) -> int:
        """Every position up to this one has been delivered (what heartbeats acknowledge)."""
        with self._lock:
            return self._received

    def add(self, position: int, item: T, nbytes: int) -> None:
        """Take one message from any lane; deliver it and any it unblocks, in order."""
        with self._lock:
            if position == UNORDERED:
                self.deliver(item)
                return
            if position < 0:
                raise ProtocolError(f"message position {position} is negative")
            if position <= self._received or position in self._held:
                self.duplicates += 1
                return
            if position == self._received + 1:
                self._received = position
                self.deliver(item)
                self._release()
                return
            if self._held_bytes + nbytes > self.max_held_bytes:
                raise ProtocolError(
                    f"message {position} arrived while {self._received + 1} is missing and "
                    f"{self._held_bytes} bytes wait for it (bound {self.max_held_bytes})"
                )
            self._held[position] = (item, nbytes)
            self._held_bytes += nbytes

    def _release(self) -> None:
        """Deliver the held messages that are next in order (under the lock)."""
        while self._received + 1 in self._held:
            self._received += 1
            ready, size = self._held.pop(self._received)
            self._held_bytes -= size
            self.deliver(ready)

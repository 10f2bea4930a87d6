"""One agent's live session: who it is, what it is doing, its outbox and its counters."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from skyfed.certs.identity import Identity
from skyfed.coordinator.inbound import Inbound
from skyfed.netinfo import CongestionControl
from skyfed.proto import serde
from skyfed.proto.outbox import Outbox
from skyfed.proto.stripes import Merge
from skyfed.status import Efficiency
from skyfed.wire import CoordinatorMessage

if TYPE_CHECKING:
    from skyfed.coordinator.links import LinkState
    from skyfed.proto import federation_pb2 as pb


@dataclass(eq=False)
class Session:
    """Mutable state of one agent stream; the federation's lock guards the round fields."""

    identity: Identity
    peer: str
    outbox: Outbox = field(default_factory=Outbox)
    state: str = "connecting"
    link: LinkState | None = None
    """The agent's link (kept across its sessions): its monitor, policy and codec."""
    codecs: frozenset[str] = frozenset()
    tp: int = 1
    dp: int = 0
    """Its site's data-parallel replicas, from the hello (0: an agent from before the field)."""
    last_error: str = ""
    """Why its site last went down (its ``Leave``, or its next hello), "" if none heard."""
    local_steps: int = 0
    """Its agent's local steps per round, from the hello (0: an agent from before the
    field): the link policy's long-phase rule reads it."""
    last_round: int = -1
    joined_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    inbound: Inbound | None = None
    """The contribution being received (or refused and discarded), if any."""
    cc: CongestionControl | None = None
    """The congestion control this session's connection gets (``skyfed/netinfo.py``)."""
    agent_cc: CongestionControl | None = None
    """The agent's congestion control toward us, from its hello (None: not said)."""
    merge: Merge | None = None
    """Its incoming messages from every connection, delivered in order (the servicer's)."""
    stripe_token: bytes = b""
    """What a Stripe call presents to join this session (empty: it does not stripe)."""
    stripes: int = 0
    """Stripe calls joined to it now, beyond its primary stream."""
    max_streams: int = 1
    """Most connections it may stripe over: the least of the agent's and ours."""
    streams: int = 1
    """Connections it was told to stripe over (the link's N at the last boundary)."""
    transfers: dict[int, list[int]] = field(default_factory=dict)
    """Bytes [up, down] of its recent rounds' exchanges, by round: their floors' bytes."""
    efficiency: Efficiency | None = None
    """Its latest timed exchange against its floor."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The named metrics its site last reported (``Announce.metrics``)."""
    metrics_round: int = -1
    """The round whose contribution carried them (-1: none yet)."""
    # Counters for status and the round's accounting.
    bytes_up: int = 0
    bytes_down: int = 0
    raw_bytes_up: int = 0
    """What its contributions weigh as fp32 (what ``bytes_up`` would be uncompressed)."""
    raw_bytes_down: int = 0
    """What its broadcasts weigh as fp32."""
    refused: int = 0
    codec_switches: int = 0
    stream_switches: int = 0
    rtt_ms: float = 0.0
    loss_pct: float = 0.0
    jitter_ms: float = 0.0
    goodput_mbit: float = 0.0
    closed: bool = False
    abort_code: grpc.StatusCode | None = None
    abort_message: str = ""
    _close_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def key(self) -> str:
        return self.identity.uri

    @property
    def connections(self) -> int:
        """TCP connections its session runs on now: the primary and the joined stripes."""
        return 1 + self.stripes

    @property
    def codec(self) -> str:
        """The codec of the session's contributions: its link's (FP32 before it joins)."""
        return self.link.run.codec if self.link is not None else "fp32"

    def send(self, message: CoordinatorMessage) -> None:
        """Queue ``message`` for the stream; its encoded size counts in ``bytes_down``."""
        if not self.closed:
            self.send_encoded(serde.coordinator_message_to_proto(message))

    def send_encoded(self, encoded: pb.CoordinatorMessage | serde.Serialized) -> None:
        """Queue a message already converted: a broadcast serializes each chunk once and
        queues the same bytes on every session (one copy of the aggregate, not one per
        agent)."""
        if not self.closed:
            self.bytes_down += serde.wire_size(encoded)
            self.outbox.put(encoded)

    def close(self, code: grpc.StatusCode | None = None, message: str = "") -> None:
        """End the stream after what is queued; with a code, end it with that status."""
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
            self.abort_code, self.abort_message = code, message
        self.outbox.close()

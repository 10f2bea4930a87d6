"""One agent's live session: who it is, what it is doing, its outbox and its counters."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import grpc

from skyfed.certs.identity import Identity
from skyfed.coordinator.aggregate import Contribution
from skyfed.proto import federation_pb2 as pb
from skyfed.proto.chunks import Assembler
from skyfed.proto.outbox import Outbox


@dataclass(eq=False)
class Session:
    """Mutable state of one agent stream; the federation's lock guards the round fields."""

    identity: Identity
    peer: str
    outbox: Outbox = field(default_factory=Outbox)
    state: str = "connecting"
    codec: str = "fp32"
    codecs: frozenset[str] = frozenset()
    tp: int = 1
    last_round: int = -1
    joined_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    # The contribution being received: its round, expected chunks, assembler, aggregate entry.
    contribution: Contribution | None = None
    contribution_round: int = -1
    chunks_expected: int = 0
    chunks_seen: int = 0
    assembler: Assembler | None = None
    discard_round: int = -1
    discard_left: int = 0
    pending_loss: float = 0.0
    pending_train_s: float = 0.0
    # Counters for status and the round's accounting.
    bytes_up: int = 0
    bytes_down: int = 0
    refused: int = 0
    codec_switches: int = 0
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

    def send(self, message: pb.CoordinatorMessage) -> None:
        if not self.closed:
            self.bytes_down += message.ByteSize()
            self.outbox.put(message)

    def close(self, code: grpc.StatusCode | None = None, message: str = "") -> None:
        """End the stream after what is queued; with a code, end it with that status."""
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
            self.abort_code, self.abort_message = code, message
        self.outbox.close()

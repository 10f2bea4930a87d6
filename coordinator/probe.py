"""The UDP loss probe's echo: authenticated, rate-bounded, never larger than what it answers.

The packet (``proto/probe_packet.py``) carries, in a probe, the longest round trip of
the sender's echoes since its last probe. The agent's round
trips reach the coordinator's monitor this way, on the path they measure, rather than in
heartbeats: those travel on the session's TCP stream, behind the gradients in flight and
their retransmissions (on the adaptive bench's far link, 300 ms and 1 % loss, up to
1-5 s). A round trip reaches the monitor only from a probe the echo answers (signed,
fresh, within the budget).

The key and the probe id are handed to an agent in its Welcome, over the mTLS stream, so
only that agent can make a probe the echo answers. The echo answers a probe only if it has
exactly this size, a known id, a valid MAC, a sequence number not seen before, and its
sender is within its packet budget; the echo is the same size as the probe and carries
its own MAC, so it is no amplifier and cannot be forged either.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from skyfed.proto.probe_packet import (
    ECHO,
    ID_BYTES,
    KEY_BYTES,
    PACKET_BYTES,
    PROBE,
    Packet,
    pack,
    peek_id,
    unpack,
)

log = logging.getLogger(__name__)

REPLAY_WINDOW = 4096


@dataclass(kw_only=True, slots=True)
class ProbeKey:
    """One session's probe credentials and what the echo saw of it."""

    probe_id: bytes
    key: bytes
    received: int = 0
    last_seq: int = -1
    seen: set[int] = field(default_factory=set)
    tokens: float = 0.0
    refilled_at: float = field(default_factory=time.monotonic)
    on_rtt: Callable[[float], None] | None = field(default=None, repr=False)
    """Called (on the echo's thread) with each round trip the agent reports."""

    @classmethod
    def new(cls) -> ProbeKey:
        return cls(probe_id=os.urandom(ID_BYTES), key=os.urandom(KEY_BYTES))

    def fresh(self, seq: int) -> bool:
        """True once per sequence number within the replay window."""
        if seq in self.seen or seq <= self.last_seq - REPLAY_WINDOW:
            return False
        self.seen.add(seq)
        if seq > self.last_seq:
            self.last_seq = seq
        if len(self.seen) > 2 * REPLAY_WINDOW:
            floor = self.last_seq - REPLAY_WINDOW
            self.seen = {s for s in self.seen if s > floor}
        return True

    def take(self, rate_pps: float, burst: float) -> bool:
        """A token bucket: may this key get one more echo now?"""
        now = time.monotonic()
        self.tokens = min(burst, self.tokens + (now - self.refilled_at) * rate_pps)
        self.refilled_at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class ProbeEcho:
    """A UDP socket echoing authenticated probes, on its own thread."""

    def __init__(
        self, host: str, port: int = 0, *, max_pps_per_key: float = 250.0, max_pps: float = 5000.0
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.port = self.sock.getsockname()[1]
        self.max_pps_per_key = max_pps_per_key
        self._total = ProbeKey(probe_id=b"", key=b"", tokens=max_pps)  # the global budget
        self.max_pps = max_pps
        self._keys: dict[bytes, ProbeKey] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.refused = 0
        self._thread = threading.Thread(target=self._serve, name="probe-echo", daemon=True)

    def start(self) -> ProbeEcho:
        self._thread.start()
        log.info("[Coordinator.Probe] listen port=%d", self.port)
        return self

    def register(self, on_rtt: Callable[[float], None] | None = None) -> ProbeKey:
        """A new key; ``on_rtt`` receives the round trips its holder reports."""
        key = ProbeKey.new()
        key.tokens = self.max_pps_per_key
        key.on_rtt = on_rtt
        with self._lock:
            self._keys[key.probe_id] = key
        return key

    def unregister(self, key: ProbeKey) -> None:
        with self._lock:
            self._keys.pop(key.probe_id, None)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            # 50 ms: how long close() may wait for the thread (20 idle wake-ups a second).
            ready, _, _ = select.select([self.sock], [], [], 0.05)
            if not ready:
                continue
            try:
                data, addr = self.sock.recvfrom(PACKET_BYTES + 1)
            except OSError:
                continue
            reply = self.answer(data)
            if reply is None:
                self.refused += 1
                continue
            try:
                self.sock.sendto(reply, addr)
            except OSError as exc:
                log.debug("[Coordinator.Probe] echo to %s failed: %s", addr, exc)

    def answer(self, data: bytes) -> bytes | None:
        """The echo of ``data``, or None when it earns none."""
        probe_id = peek_id(data)
        with self._lock:
            key = self._keys.get(probe_id) if probe_id else None
        if key is None:
            return None
        packet = unpack(data, key.key, PROBE)
        if packet is None:
            return None
        with self._lock:
            if not key.fresh(packet.seq):
                return None
            if not key.take(self.max_pps_per_key, self.max_pps_per_key):
                return None
            if not self._total.take(self.max_pps, self.max_pps):
                return None
            key.received += 1
        if packet.rtt_ms > 0 and key.on_rtt is not None:
            # Only from a probe the echo answers: the budget bounds this thread's work too.
            try:
                key.on_rtt(packet.rtt_ms)
            except Exception:  # one link's monitor must not stop every agent's echo
                log.exception("[Coordinator.Probe] round-trip report failed")
        return pack(Packet(ECHO, key.probe_id, packet.seq, packet.sent_ns), key.key)

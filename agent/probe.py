"""The agent's UDP loss probe: sequence-numbered, HMAC-signed, echoed by the coordinator.

Sends one probe every interval on its own thread, times each echo on arrival, and settles
every probe either as echoed or, once it is older than ``settle_s``, as lost. Each probe
carries the longest round trip of the echoes since the last one to the coordinator's
monitor (TCP's queues and retransmissions are not in its way); the settled and lost
counts go in the next heartbeat (:meth:`ProbeClient.take`), where a late count costs
little.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from dataclasses import dataclass

from skyfed.proto.probe_packet import ECHO, PACKET_BYTES, PROBE, Packet, pack, unpack

log = logging.getLogger(__name__)

MIN_SETTLE_S = 1.0


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """The cumulative settled counts."""

    settled: int
    lost: int


class ProbeClient:
    """Probes ``(host, port)`` with the session's key until :meth:`close`."""

    def __init__(
        self, host: str, port: int, probe_id: bytes, key: bytes, interval_s: float
    ) -> None:
        self.probe_id, self.key, self.interval_s = probe_id, key, interval_s
        info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        self.sock = socket.socket(info[0], socket.SOCK_DGRAM)
        # Not connected: a multi-homed coordinator may answer from another of its addresses;
        # the echo's MAC, not its source address, says it is genuine.
        self.address = info[4]
        self._lock = threading.Lock()
        self._outstanding: dict[int, int] = {}  # seq -> sent_ns
        self._unreported_ms = 0.0  # the longest round trip since the last probe, to report
        self.sent = self.settled = self.lost = 0
        self.srtt_ms = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="link-probe", daemon=True)

    def start(self) -> ProbeClient:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self.sock.close()

    def take(self) -> ProbeReport:
        """The running counts, for a heartbeat."""
        with self._lock:
            return ProbeReport(self.settled, self.lost)

    def _run(self) -> None:
        next_send = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_send:
                self._send()
                self._settle()
                next_send += self.interval_s
                if next_send < now:  # fell behind (suspended): do not burst to catch up
                    next_send = now + self.interval_s
            try:
                ready, _, _ = select.select([self.sock], [], [], max(0.0, next_send - now))
                if ready:
                    self._receive()
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(self.interval_s)  # e.g. ECONNREFUSED from an earlier probe

    def _send(self) -> None:
        seq, sent_ns = self.sent, time.monotonic_ns()
        with self._lock:
            self._outstanding[seq] = sent_ns
            rtt_ms, self._unreported_ms = self._unreported_ms, 0.0
        self.sent += 1
        try:
            self.sock.sendto(
                pack(Packet(PROBE, self.probe_id, seq, sent_ns, rtt_ms), self.key), self.address
            )
        except OSError as exc:
            log.debug("[Agent.Probe] send failed: %s", exc)

    def _receive(self) -> None:
        data = self.sock.recv(PACKET_BYTES + 1)
        now_ns = time.monotonic_ns()
        packet = unpack(data, self.key, ECHO)
        if packet is None or packet.probe_id != self.probe_id:
            return
        with self._lock:
            sent_ns = self._outstanding.pop(packet.seq, None)
            if sent_ns is None or sent_ns != packet.sent_ns:
                return  # already given up on, or not ours
            rtt_ms = (now_ns - sent_ns) / 1e6
            # Echoes that bunch up between probes (a queue draining) arrive ever sooner:
            # the longest of them is the link's state, so it is the one reported.
            self._unreported_ms = max(self._unreported_ms, rtt_ms)
            self.settled += 1
            self.srtt_ms = rtt_ms if not self.srtt_ms else 0.875 * self.srtt_ms + 0.125 * rtt_ms

    def _settle(self) -> None:
        """Give up on probes older than a few round trips (at least a second)."""
        settle_ns = int(max(MIN_SETTLE_S, 4 * self.srtt_ms / 1000) * 1e9)
        cutoff = time.monotonic_ns() - settle_ns
        with self._lock:
            old = [seq for seq, sent in self._outstanding.items() if sent < cutoff]
            for seq in old:
                del self._outstanding[seq]
            self.settled += len(old)
            self.lost += len(old)

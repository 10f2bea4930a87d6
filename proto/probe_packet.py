"""The UDP loss probe's packet, which the agent's probe and the coordinator's echo share.

A probe and its echo are one fixed 48-byte packet::

    magic "SFP1" | kind u8 (0 probe, 1 echo) | rtt u24 | probe_id 8 B | seq u64 |
    sent_ns u64 | HMAC-SHA256(key, the 32 bytes before)[:16]

``rtt`` is, in a probe, the longest round trip of the sender's echoes since its last
probe, in units of 10 us (0: none; at most ~168 s), and 0 in an echo.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

MAGIC = b"SFP1"
PROBE, ECHO = 0, 1
_HEADER = struct.Struct("!4sB3s8sQQ")
RTT_UNIT_MS = 0.01
_RTT_MAX = (1 << 24) - 1
MAC_BYTES = 16
PACKET_BYTES = _HEADER.size + MAC_BYTES
KEY_BYTES = 32
ID_BYTES = 8


@dataclass(frozen=True, slots=True)
class Packet:
    kind: int
    probe_id: bytes
    seq: int
    sent_ns: int
    rtt_ms: float = 0.0
    """A probe's report: its sender's longest round trip since its last probe (0: none),
    to ``RTT_UNIT_MS``."""


def pack(packet: Packet, key: bytes) -> bytes:
    # A positive round trip never packs to 0, which means "none".
    units = max(1, round(packet.rtt_ms / RTT_UNIT_MS)) if packet.rtt_ms > 0 else 0
    rtt = min(_RTT_MAX, units).to_bytes(3, "big")
    header = _HEADER.pack(MAGIC, packet.kind, rtt, packet.probe_id, packet.seq, packet.sent_ns)
    return header + hmac.digest(key, header, hashlib.sha256)[:MAC_BYTES]


def peek_id(data: bytes) -> bytes | None:
    """The probe id of a well-formed packet of the right size, before any MAC check."""
    if len(data) != PACKET_BYTES or data[:4] != MAGIC:
        return None
    return data[8:16]


def unpack(data: bytes, key: bytes, kind: int) -> Packet | None:
    """The packet if it is well formed, of ``kind`` and authentic under ``key``; else None."""
    if peek_id(data) is None:
        return None
    header, mac = data[: _HEADER.size], data[_HEADER.size :]
    if not hmac.compare_digest(mac, hmac.digest(key, header, hashlib.sha256)[:MAC_BYTES]):
        return None
    _, got_kind, rtt, probe_id, seq, sent_ns = _HEADER.unpack(header)
    if got_kind != kind:
        return None
    return Packet(got_kind, probe_id, seq, sent_ns, int.from_bytes(rtt, "big") * RTT_UNIT_MS)

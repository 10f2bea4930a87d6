"""The UDP loss probe: only the key's holder gets echoes, never more bytes than it sent, and
its reports of round trips reach the monitor."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from skyfed.agent.probe import ProbeClient
from skyfed.coordinator.probe import ProbeEcho
from skyfed.proto.probe_packet import ECHO, PACKET_BYTES, PROBE, Packet, pack, unpack


@pytest.fixture
def echo() -> Iterator[ProbeEcho]:
    server = ProbeEcho("127.0.0.1", 0, max_pps_per_key=100).start()
    yield server
    server.close()


@pytest.fixture
def udp() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(0.3)
    yield sock
    sock.close()


def exchange(sock: socket.socket, echo: ProbeEcho, data: bytes) -> bytes | None:
    sock.sendto(data, ("127.0.0.1", echo.port))
    try:
        return sock.recv(4096)
    except TimeoutError:
        return None


def probe(
    key, seq: int = 0, *, kind: int = PROBE, secret: bytes | None = None, rtt_ms: float = 0.0
) -> bytes:
    return pack(Packet(kind, key.probe_id, seq, 12345, rtt_ms), secret or key.key)


def test_a_probe_signed_with_the_session_key_is_echoed_same_size_and_signed(echo, udp):
    key = echo.register()
    reply = exchange(udp, echo, probe(key, seq=3))
    assert reply is not None and len(reply) == PACKET_BYTES
    assert unpack(reply, key.key, ECHO) == Packet(ECHO, key.probe_id, 3, 12345)
    assert unpack(reply, key.key, PROBE) is None  # an echo cannot be bounced back as a probe


def test_a_probe_without_the_right_hmac_gets_no_echo(echo, udp):
    key = echo.register()
    forged = probe(key, secret=b"k" * 32)
    assert exchange(udp, echo, forged) is None
    tampered = bytearray(probe(key, seq=1))
    tampered[20] ^= 1  # the sequence number, after signing
    assert exchange(udp, echo, bytes(tampered)) is None
    assert echo.refused == 2


def test_unknown_ids_wrong_sizes_echo_packets_and_replays_get_no_echo(echo, udp):
    key = echo.register()
    other = echo.register()
    echo.unregister(other)
    assert exchange(udp, echo, probe(other)) is None  # a key no longer registered
    assert exchange(udp, echo, probe(key) + b"\0" * 100) is None  # no bigger packets
    assert exchange(udp, echo, probe(key)[:-1]) is None
    assert exchange(udp, echo, probe(key, kind=ECHO)) is None
    assert exchange(udp, echo, probe(key, seq=9)) is not None
    assert exchange(udp, echo, probe(key, seq=9)) is None  # the same probe again


def test_the_echo_answers_at_most_its_packet_budget_and_takes_reports_within_it(echo, udp):
    reported: list[float] = []
    key = echo.register(on_rtt=reported.append)
    for seq in range(300):
        udp.sendto(probe(key, seq, rtt_ms=10.0), ("127.0.0.1", echo.port))
    time.sleep(0.3)
    udp.settimeout(0.05)
    replies = 0
    with pytest.raises(TimeoutError):
        while True:
            udp.recv(4096)
            replies += 1
    assert 100 <= replies <= 140  # a 100-packet burst, then 100 per second
    assert len(reported) == replies  # the budget bounds the monitor's work as well


def test_a_probe_reports_its_senders_round_trip_only_when_authentic_and_fresh(echo, udp):
    reported: list[float] = []
    key = echo.register(on_rtt=reported.append)
    assert exchange(udp, echo, probe(key, seq=1, rtt_ms=301.234)) is not None
    assert exchange(udp, echo, probe(key, seq=2)) is not None  # no round trip to report
    assert exchange(udp, echo, probe(key, seq=1, rtt_ms=5.0)) is None  # a replay
    assert exchange(udp, echo, probe(key, seq=3, rtt_ms=5.0, secret=b"k" * 32)) is None
    assert reported == [pytest.approx(301.23)]  # carried in units of 10 us
    assert unpack(probe(key, rtt_ms=1e9), key.key, PROBE).rtt_ms == pytest.approx(167772.15)


def test_the_client_reports_round_trips_and_counts_nothing_lost_on_loopback(echo):
    reported: list[float] = []
    key = echo.register(on_rtt=reported.append)
    client = ProbeClient("127.0.0.1", echo.port, key.probe_id, key.key, interval_s=0.01).start()
    try:
        time.sleep(1.5)
        report = client.take()
    finally:
        client.close()
    assert len(reported) > 50
    assert all(0 < rtt < 50 for rtt in reported)
    assert report.settled > 50 and report.lost == 0


def test_the_client_settles_unanswered_probes_as_lost(echo):
    key = echo.register()
    echo.unregister(key)  # the echo no longer answers this key
    client = ProbeClient("127.0.0.1", echo.port, key.probe_id, key.key, interval_s=0.02).start()
    try:
        time.sleep(1.6)
        report = client.take()
    finally:
        client.close()
    assert report.settled == report.lost > 10

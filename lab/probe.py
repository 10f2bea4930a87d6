"""Measurement tools run inside lab namespaces: UDP echo and ping, UDP blast and sink, TCP bulk,
TLS request-response rounds over one warm connection.

Run as ``python -m skyfed.lab.probe TOOL ...``; servers print ``ready`` once bound
(``tls-respond``: ``ready PORT``, so that ``--port 0`` takes a free one), and every tool
that measures prints one JSON line of results. The tools run at real-time
priority, like the lab's forwarder: a self-check measures the link, and on a host busy
with training a starved blaster would offer less than the link carries (docs/lab.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable

from skyfed.lab.forwarder import RT_PRIORITY

PROBE = struct.Struct("!Id")
"""Probe payload head: sequence number, send time (client clock)."""
PROBE_SIZE = 64
ROUND_HEAD = struct.Struct("!QQ")
"""A TLS round's request head: bytes that follow it up, bytes to answer down."""
UDP_IP_OVERHEAD = 28
RCVBUF = 8 << 20
SO_RCVBUFFORCE = 33
"""Linux: set the receive buffer past net.core.rmem_max (root); Python has no name for it."""


def _ready(port: int | None = None) -> None:
    sys.stdout.write("ready\n" if port is None else f"ready {port}\n")
    sys.stdout.flush()


def _result(data: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def _udp(bind: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
    sock.bind((bind, port))
    return sock


def echo(args: argparse.Namespace) -> None:
    """Send every datagram back to where it came from, until ``--duration-s``."""
    sock = _udp(args.bind, args.port)
    _ready()
    deadline = time.monotonic() + args.duration_s
    while (left := deadline - time.monotonic()) > 0:
        if select.select([sock], [], [], left)[0]:
            data, peer = sock.recvfrom(2048)
            sock.sendto(data, peer)


def ping(args: argparse.Namespace) -> None:
    """Send ``--count`` probes ``--interval-ms`` apart; report what came back and when."""
    sock = _udp("0.0.0.0", 0)
    sock.connect((args.to, args.port))
    rtts_ms: dict[int, float] = {}
    start = time.monotonic()
    sent = 0
    end = start + args.count * args.interval_ms / 1000.0 + args.wait_s
    while (now := time.monotonic()) < end and (sent < args.count or len(rtts_ms) < sent):
        if sent < args.count and now >= start + sent * args.interval_ms / 1000.0:
            sock.send(PROBE.pack(sent, now).ljust(PROBE_SIZE, b"\0"))
            sent += 1
            continue
        due = start + sent * args.interval_ms / 1000.0 if sent < args.count else end
        if select.select([sock], [], [], max(0.0, min(due, end) - now))[0]:
            seq, t_sent = PROBE.unpack_from(sock.recv(2048))
            rtts_ms[seq] = (time.monotonic() - t_sent) * 1000.0
    _result({"sent": sent, "received": len(rtts_ms), "rtts_ms": sorted(rtts_ms.values())})


def sink(args: argparse.Namespace) -> None:
    """Count datagrams until ``--idle-s`` passes without one (after the first)."""
    sock = _udp(args.bind, args.port)
    _ready()
    count = size = 0
    first = last = 0.0
    deadline = time.monotonic() + args.duration_s
    while (left := deadline - time.monotonic()) > 0:
        wait = min(left, args.idle_s) if count else left
        if not select.select([sock], [], [], wait)[0]:
            if count:
                break
            continue
        size = len(sock.recv(65536))
        last = time.monotonic()
        first = first or last
        count += 1
    _result({"packets": count, "ip_bytes": size + UDP_IP_OVERHEAD, "first": first, "last": last})


def blast(args: argparse.Namespace) -> None:
    """Send UDP datagrams of ``--size`` bytes at ``--rate-mbit`` for ``--duration-s``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    sock.connect((args.to, args.port))
    payload = b"\0" * args.size
    pps = args.rate_mbit * 1e6 / 8 / (args.size + UDP_IP_OVERHEAD)
    start = time.monotonic()
    sent = refused = 0
    while (elapsed := time.monotonic() - start) < args.duration_s:
        due = int(elapsed * pps) + 1
        while sent < due:
            try:
                sock.send(payload)
            except (BlockingIOError, ConnectionRefusedError):
                refused += 1
            sent += 1
        time.sleep(0.0002)
    _result({"sent": sent, "refused": refused, "seconds": time.monotonic() - start})


def tcp_sink(args: argparse.Namespace) -> None:
    """Accept one TCP connection and count its bytes."""
    server = socket.create_server((args.bind, args.port))
    _ready()
    server.settimeout(args.duration_s)
    conn, _ = server.accept()
    total, first = 0, 0.0
    while chunk := conn.recv(1 << 20):
        total += len(chunk)
        first = first or time.monotonic()
    conn.close()  # the sender of --bytes waits for this: every byte is in
    _result({"bytes": total, "seconds": time.monotonic() - first})


def tcp_send(args: argparse.Namespace) -> None:
    """Send as fast as TCP allows for ``--duration-s``; with ``--bytes N``, send N bytes on a
    fresh connection and time it from connect until the sink has all of them (its close)."""
    start = time.monotonic()
    sock = socket.create_connection((args.to, args.port), timeout=10)
    sock.settimeout(None)  # a lossy CUBIC link may take many seconds per block
    block = b"\0" * (1 << 16)  # small: a timed run ends close to --duration-s
    sent = 0
    while (sent < args.bytes) if args.bytes else (time.monotonic() - start < args.duration_s):
        piece = block if not args.bytes else block[: min(len(block), args.bytes - sent)]
        sock.sendall(piece)
        sent += len(piece)
    if args.bytes:
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # b"" once the sink has read everything and closed
    sock.close()
    _result({"bytes": sent, "seconds": time.monotonic() - start})


def _tls_context(certs: str, name: str, server: bool) -> ssl.SSLContext:
    """Mutual TLS with the federation's files (``ca.crt``, ``NAME.crt``/``.key``), as its
    gRPC channels have: a handshake that proves the same certificates, not a plain socket."""
    purpose = ssl.Purpose.CLIENT_AUTH if server else ssl.Purpose.SERVER_AUTH
    ctx = ssl.create_default_context(purpose, cafile=os.path.join(certs, "ca.crt"))
    ctx.load_cert_chain(os.path.join(certs, f"{name}.crt"), os.path.join(certs, f"{name}.key"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _read_exactly(conn: ssl.SSLSocket, nbytes: int, buf: bytearray) -> int:
    """Read ``nbytes`` into ``buf`` (reused, so a round costs no allocation); bytes read."""
    view, got = memoryview(buf), 0
    while got < nbytes:
        n = conn.recv_into(view, min(len(buf), nbytes - got))
        if not n:
            break
        got += n
    return got


def tls_respond(args: argparse.Namespace) -> None:
    """Accept ``--peers`` mTLS connections (one per agent); per round, once every peer's
    request (head, then its bytes) is in, answer each with the bytes its head asks for, as
    a federation's broadcast waits for every upload; until the peers close."""
    ctx = _tls_context(args.certs, args.name, server=True)
    server = socket.create_server((args.bind, args.port), backlog=args.peers)
    _ready(server.getsockname()[1])
    server.settimeout(args.duration_s)
    conns = []
    for _ in range(args.peers):
        raw, _ = server.accept()
        raw.settimeout(args.duration_s)
        conns.append(ctx.wrap_socket(raw, server_side=True))
    all_in = threading.Barrier(args.peers)
    serving = [threading.Thread(target=_respond, args=(conn, all_in)) for conn in conns]
    for thread in serving:
        thread.start()
    for thread in serving:
        thread.join()


def _respond(conn: ssl.SSLSocket, all_in: threading.Barrier) -> None:
    """One peer's rounds: its request read whole, then the answer once every peer's is."""
    with conn:
        buf = bytearray(1 << 20)
        while _read_exactly(conn, ROUND_HEAD.size, buf) == ROUND_HEAD.size:
            up, down = ROUND_HEAD.unpack_from(buf)
            if _read_exactly(conn, up, buf) < up:
                break
            try:
                all_in.wait()
            except threading.BrokenBarrierError:  # another peer closed: no more rounds
                return
            block = bytes(1 << 16)
            for start in range(0, down, len(block)):
                conn.sendall(block[: min(len(block), down - start)])
        all_in.abort()  # this peer closed: the others' rounds end too


def tls_rounds(args: argparse.Namespace) -> None:
    """Over one mTLS connection, ``--warmup`` then ``--rounds`` request-responses of
    ``--up`` bytes answered by ``--down`` bytes, ``--idle-s`` apart (a round's training);
    each timed from the request's first byte to the answer's last. The warm-up rounds
    (untimed in the median the bench takes) open the windows, as a session's first rounds do."""
    ctx = _tls_context(args.certs, args.name, server=False)
    raw = socket.create_connection((args.to, args.port), timeout=10)
    raw.settimeout(args.duration_s)
    seconds = []
    with ctx.wrap_socket(raw, server_hostname=args.to) as conn:
        block, buf = bytes(1 << 16), bytearray(1 << 20)
        for i in range(args.warmup + args.rounds):
            if i:
                time.sleep(args.idle_s)
            start = time.monotonic()
            conn.sendall(ROUND_HEAD.pack(args.up, args.down))
            for sent in range(0, args.up, len(block)):
                conn.sendall(block[: min(len(block), args.up - sent)])
            got = _read_exactly(conn, args.down, buf)
            seconds.append(time.monotonic() - start)
            if got < args.down:
                raise SystemExit(f"tls-rounds: the answer ended after {got} of {args.down} bytes")
    _result({"seconds": seconds, "warmup": args.warmup})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m skyfed.lab.probe", description=__doc__)
    tools = parser.add_subparsers(dest="tool", required=True)
    tool_funcs: dict[str, Callable[[argparse.Namespace], None]] = {
        "echo": echo,
        "ping": ping,
        "sink": sink,
        "blast": blast,
        "tcp-sink": tcp_sink,
        "tcp-send": tcp_send,
        "tls-respond": tls_respond,
        "tls-rounds": tls_rounds,
    }
    for name, func in tool_funcs.items():
        sub = tools.add_parser(name, help=func.__doc__)
        sub.set_defaults(func=func)
        sub.add_argument("--port", type=int, required=True)
        sub.add_argument("--duration-s", type=float, default=30.0)
        if name in ("echo", "sink", "tcp-sink", "tls-respond"):
            sub.add_argument("--bind", required=True)
        else:
            sub.add_argument("--to", required=True)
    tools.choices["ping"].add_argument("--count", type=int, default=1000)
    tools.choices["ping"].add_argument("--interval-ms", type=float, default=1.0)
    tools.choices["ping"].add_argument("--wait-s", type=float, default=1.0)
    tools.choices["sink"].add_argument("--idle-s", type=float, default=0.75)
    tools.choices["blast"].add_argument("--rate-mbit", type=float, required=True)
    tools.choices["blast"].add_argument("--size", type=int, default=1472)
    tools.choices["tcp-send"].add_argument("--bytes", type=int, default=0)
    tools.choices["tls-respond"].add_argument(
        "--peers", type=int, default=1, help="Connections, each round answered once all are in."
    )
    for name in ("tls-respond", "tls-rounds"):
        tools.choices[name].add_argument("--certs", required=True, help="ca.crt, NAME.crt/.key")
        tools.choices[name].add_argument("--name", required=True, help="This end's certificate.")
    rounds = tools.choices["tls-rounds"]
    rounds.add_argument("--up", type=int, required=True, help="Request bytes per round.")
    rounds.add_argument("--down", type=int, required=True, help="Answer bytes per round.")
    rounds.add_argument("--rounds", type=int, default=5)
    rounds.add_argument("--warmup", type=int, default=2)
    rounds.add_argument("--idle-s", type=float, default=1.0)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    args = _parser().parse_args(argv)
    with contextlib.suppress(PermissionError):  # unprivileged: measured at normal priority
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
    args.func(args)


if __name__ == "__main__":
    main()

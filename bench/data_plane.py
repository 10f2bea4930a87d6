"""What moving bulk bytes costs in CPU: gRPC's stream against a plain TLS socket.

At 100M FP16 parameters the coordinator receives 600 MB and sends 600 MB a round with
three agents. This bench moves ``--mb`` megabytes over loopback in 1 MiB messages, both
directions (a client that uploads, as agents do; a server that sends, as the broadcast
does), through each transport in fresh processes, and prints the receiver's and the
sender's CPU-seconds per GB (``getrusage``: user + system, all threads). Both use
mutual TLS with the federation's certificates (``certs/testing.py``).

- ``grpc``: a stream-stream call with bytes in and out; of the coordinator's server
  options (``coordinator/server.py``) the message limits and ``so_reuseport``, of the
  agent's channel options (``agent/link.py``) the limits and BDP probing. Keepalives and
  the server's BDP probing are left out: they send pings, not the data's bytes.
- ``tls``: Python's ``ssl`` over one TCP socket, each message a 4-byte length and its
  bytes, received with ``recv_into`` into one reused buffer.

    python bench/data_plane.py [--mb 1024] [--reps 3] [--record WHAT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

MESSAGE = 1 << 20
_LEN = struct.Struct("<I")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _grpc_server(certs: Path, count: int, direction: str) -> None:
    import grpc

    key, chain = (certs / "coordinator.key").read_bytes(), (certs / "coordinator.crt").read_bytes()
    creds = grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=(certs / "ca.crt").read_bytes(), require_client_auth=True
    )
    payload = os.urandom(MESSAGE)
    done = futures.Future()  # type: ignore[var-annotated]

    def move(requests, context):  # noqa: ANN001, ANN202
        start = _cpu()
        if direction == "up":
            got = sum(len(m) for m in requests)
            done.set_result((got, _cpu() - start))
            yield b"ok"
        else:
            next(requests)
            for _ in range(count):
                yield payload
            done.set_result((count * MESSAGE, _cpu() - start))

    handler = grpc.method_handlers_generic_handler(
        "bench.Bulk", {"Move": grpc.stream_stream_rpc_method_handler(move)}
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[
            ("grpc.max_receive_message_length", 8 << 20),
            ("grpc.max_send_message_length", 8 << 20),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    print(json.dumps({"port": port}), flush=True)
    moved, cpu = done.result()
    time.sleep(0.2)
    server.stop(1).wait()
    print(json.dumps({"bytes": moved, "cpu_s": cpu}), flush=True)


def _grpc_client(certs: Path, port: int, count: int, direction: str) -> None:
    import grpc

    creds = grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.crt").read_bytes(),
        private_key=(certs / "aws-1.key").read_bytes(),
        certificate_chain=(certs / "aws-1.crt").read_bytes(),
    )
    channel = grpc.secure_channel(
        f"127.0.0.1:{port}",
        creds,
        options=[
            ("grpc.max_receive_message_length", 8 << 20),
            ("grpc.max_send_message_length", 8 << 20),
            ("grpc.ssl_target_name_override", "localhost"),
            ("grpc.http2.bdp_probe", 1),
        ],
    )
    move = channel.stream_stream("/bench.Bulk/Move")
    payload = os.urandom(MESSAGE)
    grpc.channel_ready_future(channel).result(timeout=10)
    start = _cpu()
    if direction == "up":
        list(move(iter([payload] * count)))
        moved = count * MESSAGE
    else:
        moved = sum(len(m) for m in move(iter([b"go"])))
    print(json.dumps({"bytes": moved, "cpu_s": _cpu() - start}), flush=True)
    channel.close()


def _tls_context(certs: Path, side: int, name: str) -> ssl.SSLContext:
    context = ssl.SSLContext(side)
    context.load_cert_chain(certs / f"{name}.crt", certs / f"{name}.key")
    context.load_verify_locations(certs / "ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    return context


def _recv_exact(sock: ssl.SSLSocket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError("closed mid-message")
        got += n


def _tls_receive(sock: ssl.SSLSocket) -> int:
    buffer = bytearray(MESSAGE)
    head, moved = memoryview(bytearray(_LEN.size)), 0
    while True:
        _recv_exact(sock, head)
        (length,) = _LEN.unpack(head)
        if length == 0:
            return moved
        _recv_exact(sock, memoryview(buffer)[:length])
        moved += length


def _tls_send(sock: ssl.SSLSocket, count: int) -> int:
    payload = os.urandom(MESSAGE)
    for _ in range(count):
        sock.sendall(_LEN.pack(len(payload)))
        sock.sendall(payload)
    sock.sendall(_LEN.pack(0))
    return count * MESSAGE


def _tls_server(certs: Path, count: int, direction: str) -> None:
    context = _tls_context(certs, ssl.PROTOCOL_TLS_SERVER, "coordinator")
    listener = socket.create_server(("127.0.0.1", 0))
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
    raw, _ = listener.accept()
    with context.wrap_socket(raw, server_side=True) as sock:
        start = _cpu()
        moved = _tls_receive(sock) if direction == "up" else _tls_send(sock, count)
        cpu = _cpu() - start
        if direction == "up":
            sock.sendall(b"k")
        else:
            sock.recv(1)
    print(json.dumps({"bytes": moved, "cpu_s": cpu}), flush=True)


def _tls_client(certs: Path, port: int, count: int, direction: str) -> None:
    context = _tls_context(certs, ssl.PROTOCOL_TLS_CLIENT, "aws-1")
    with context.wrap_socket(
        socket.create_connection(("127.0.0.1", port)), server_hostname="localhost"
    ) as sock:
        sock.do_handshake()
        start = _cpu()
        if direction == "up":
            moved = _tls_send(sock, count)
            sock.recv(1)
        else:
            moved = _tls_receive(sock)
            sock.sendall(b"k")
        cpu = _cpu() - start
    print(json.dumps({"bytes": moved, "cpu_s": cpu}), flush=True)


def _one(certs: Path, transport: str, direction: str, count: int) -> dict[str, float]:
    me = [sys.executable, __file__, "--certs", str(certs), "--count", str(count)]
    server = subprocess.Popen(
        [*me, "--role", f"{transport}-server", "--direction", direction],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    port = json.loads(server.stdout.readline())["port"]
    started = time.monotonic()
    client = subprocess.run(
        [*me, "--role", f"{transport}-client", "--direction", direction, "--port", str(port)],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.monotonic() - started
    served = json.loads(server.stdout.readline())
    server.wait(timeout=30)
    sent = json.loads(client.stdout.strip().splitlines()[-1])
    for side, moved in (("server", served["bytes"]), ("client", sent["bytes"])):
        if moved != count * MESSAGE:
            raise SystemExit(
                f"{transport} {direction}: the {side} moved {moved} bytes of {count * MESSAGE}"
            )
    gb = count * MESSAGE / 1e9
    receiver, sender = (served, sent) if direction == "up" else (sent, served)
    return {
        "recv_cpu_per_gb": receiver["cpu_s"] / gb,
        "send_cpu_per_gb": sender["cpu_s"] / gb,
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--role", default="")
    parser.add_argument("--certs", type=Path)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--direction", default="up")
    parser.add_argument(
        "--record", metavar="WHAT", help="Also write bench/results/<date>-data_plane-WHAT.md."
    )
    args = parser.parse_args()
    if args.role:
        roles = {
            "grpc-server": lambda: _grpc_server(args.certs, args.count, args.direction),
            "grpc-client": lambda: _grpc_client(args.certs, args.port, args.count, args.direction),
            "tls-server": lambda: _tls_server(args.certs, args.count, args.direction),
            "tls-client": lambda: _tls_client(args.certs, args.port, args.count, args.direction),
        }
        roles[args.role]()
        return
    from skyfed.certs.testing import make_federation

    lines: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    count = args.mb * (1 << 20) // MESSAGE
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp)
        make_federation(certs)
        for rep in range(args.reps):  # alternate, so the host's drift touches both alike
            for transport in ("grpc", "tls"):
                for direction in ("up", "down"):
                    row = _one(certs, transport, direction, count)
                    rows.setdefault((transport, direction), []).append(row)
                    say(
                        f"rep {rep} {transport:4} {direction:4} receiver "
                        f"{row['recv_cpu_per_gb']:.3f} sender {row['send_cpu_per_gb']:.3f} "
                        f"CPU-s/GB, {row['wall_s']:.1f} s"
                    )
    say()
    say(f"{args.mb} MB in 1 MiB messages over loopback, medians of {args.reps}")
    say("| transport | direction | receiver CPU-s / GB | sender CPU-s / GB |")
    say("|---|---|---|---|")
    for (transport, direction), each in rows.items():
        recv = statistics.median(r["recv_cpu_per_gb"] for r in each)
        send = statistics.median(r["send_cpu_per_gb"] for r in each)
        say(f"| {transport} | {direction} | {recv:.3f} | {send:.3f} |")
    if args.record:
        from results_file import record

        argv = [a for a in sys.argv[1:]]
        print(record("data_plane", args.record, argv, ["```", *lines, "```"]))


if __name__ == "__main__":
    main()

"""A real etcd for tests and the chaos bench (``bench/failover.py``): Debian's
``etcd-server`` on free loopback ports in a temp dir; a TCP relay that can be cut, to
partition one replica from etcd or from the agents, and healed; and the ledger of what an
agent's log says it applied, which both check failovers by."""

from __future__ import annotations

import collections
import contextlib
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from skyfed.procs import terminate

START_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class ServerTls:
    """etcd's own certificate, and the CA whose certificates its clients must show."""

    cert: Path
    key: Path
    client_ca: Path


class EtcdServer:
    """One etcd member, single-node cluster, data in ``directory``; with ``tls``, its
    clients speak https and must show a certificate of ``tls.client_ca``."""

    def __init__(self, directory: Path, tls: ServerTls | None = None) -> None:
        binary = shutil.which("etcd")
        if binary is None:  # a missing part fails the test, never skips it
            raise RuntimeError("etcd is not installed: bash .ci/system-packages (etcd-server)")
        self.directory = directory
        self.tls = tls
        self.client_port, self.peer_port = free_port(), free_port()
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        directory.mkdir(parents=True, exist_ok=True)
        argv = [
            binary,
            "--name=test",
            f"--data-dir={directory / 'data'}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
            "--log-level=warn",
        ]
        if tls is not None:
            argv += [
                f"--cert-file={tls.cert}",
                f"--key-file={tls.key}",
                "--client-cert-auth",
                f"--trusted-ca-file={tls.client_ca}",
            ]
        self._log = open(directory / "etcd.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        """Until the client port accepts connections (with TLS the tests check more)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited {self.proc.returncode}: see {self.directory}")
            if self.tls is not None:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", self.client_port), timeout=1),
                ):
                    return
            else:
                with (
                    contextlib.suppress(OSError),
                    urllib.request.urlopen(self.url + "/health", timeout=1) as reply,
                ):
                    if b'"true"' in reply.read():
                        return
            time.sleep(0.1)
        raise RuntimeError(f"etcd not healthy within {START_TIMEOUT_S} s")

    def stop(self) -> None:
        terminate(self.proc)
        self._log.close()


class Relay:
    """A TCP relay to ``port`` (a replica's etcd, or a replica's port as agents and the
    other replicas reach it). ``cut()`` drops every connection and black-holes new ones
    (accepted, never answered), as a partition does; ``heal()`` relays new ones again."""

    def __init__(self, port: int) -> None:
        self.target = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._sockets.clear()

    def heal(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
            if self._cut.is_set():
                continue  # held open, never answered
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    for s in (source, sink):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


APPLIED = re.compile(r"\[Agent\.Phase\] round=(\d+) applied")
LOADED = re.compile(r"\[Agent\.Sync\] weights of round (-?\d+) loaded")
DIGESTED = re.compile(r"\[Agent\.Phase\] round=(\d+) digested .*digest=(\S+)")


@dataclass(frozen=True)
class Ledger:
    """What one agent's log (at DEBUG) says it applied."""

    lost: int
    """Rounds it had applied and lost: it loaded weights older than a round it held."""
    twice: int
    """Rounds it applied a second time."""
    digests: dict[int, str]
    """Each round it verified, with the digest it verified (16 characters)."""


def agent_ledger(log: str) -> Ledger:
    held, lost = -1, 0
    applied: collections.Counter[int] = collections.Counter()
    digests = {}
    for line in log.splitlines():
        if m := APPLIED.search(line):
            applied[int(m.group(1))] += 1
            held = int(m.group(1))
        elif m := LOADED.search(line):
            lost += max(0, held - int(m.group(1)))
            held = int(m.group(1))
        elif m := DIGESTED.search(line):
            digests[int(m.group(1))] = m.group(2)
    return Ledger(lost, sum(n - 1 for n in applied.values()), digests)

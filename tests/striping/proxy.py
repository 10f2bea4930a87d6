"""A TCP relay between agents and the coordinator whose connections a test can cut.

Real sockets end to end (TLS passes through untouched); each accepted connection is
numbered in the order it arrived, counts the bytes it carried each way, and can be reset
mid-transfer, as a middlebox or a flapping path would.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field


@dataclass
class Relayed:
    """One relayed connection: its two sockets and the bytes each way so far."""

    index: int
    client: socket.socket
    upstream: socket.socket
    up_bytes: int = 0
    down_bytes: int = 0
    cut: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class CuttingRelay:
    """Listens on 127.0.0.1 (port 0) and relays each connection to ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[Relayed] = []
        self._armed: dict[int, tuple[int | None, int | None]] = {}
        self.cut_done = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                conn = Relayed(len(self.connections), client, upstream)
                self.connections.append(conn)
            threading.Thread(target=self._pump, args=(conn, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(conn, False), daemon=True).start()

    def _pump(self, conn: Relayed, up: bool) -> None:
        src, dst = (conn.client, conn.upstream) if up else (conn.upstream, conn.client)
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
                with conn.lock:
                    if up:
                        conn.up_bytes += len(data)
                    else:
                        conn.down_bytes += len(data)
                    up_at, down_at = self._armed.get(conn.index, (None, None))
                    due = (up_at is not None and conn.up_bytes >= up_at) or (
                        down_at is not None and conn.down_bytes >= down_at
                    )
                if due and not conn.cut:
                    self.cut(conn.index)
                    return
        except OSError:
            pass
        for s in (dst, src):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def arm(
        self, index: int, *, up_bytes: int | None = None, down_bytes: int | None = None
    ) -> None:
        """Reset connection ``index`` (counted from 0 in arrival order) once it has carried
        ``up_bytes`` towards the coordinator or ``down_bytes`` back: mid-transfer."""
        self._armed[index] = (up_bytes, down_bytes)

    def cut(self, index: int) -> None:
        """Reset connection ``index`` on both sides at once (RST, nothing more delivered)."""
        conn = self.connections[index]
        conn.cut = True
        for s in (conn.client, conn.upstream):
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
        self.cut_done.set()

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for conn in self.connections:
            for s in (conn.client, conn.upstream):
                with contextlib.suppress(OSError):
                    s.close()

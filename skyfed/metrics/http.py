"""The plain-HTTP side port: ``/metrics`` for Prometheus, ``/healthz`` and ``/readyz`` for
Kubernetes probes. It is outside mTLS, so it is off unless asked for, loopback unless the
operator says otherwise, and serves nothing secret (docs/operations.md, "Security model").

A small server of our own, on one asyncio thread: prometheus-client's own
(``start_http_server``) and ``http.server``'s threading server start a thread per
connection and never time an idle one out, so 2000 idle connections to a pod's public
metrics port held 2016 threads and 50 MB for as long as they stayed open. Here a
connection costs no thread, at most ``MAX_CONNECTIONS`` are served at once (more are
closed on arrival), and each must send its request within ``REQUEST_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from skyfed.logs import Throttle

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 128
"""Connections served at once; one past it is closed as it arrives (a scrape retries)."""
REQUEST_TIMEOUT_S = 5.0
"""How long a connection may take to send its request head, and to take the answer."""
MAX_HEAD_BYTES = 8192
"""The longest request head (request line and headers) read; a longer one is closed."""
PATHS = ("/metrics", "/healthz", "/readyz")
TEXT = "text/plain; charset=utf-8"
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
REASONS[503] = "Service Unavailable"

# Ready: (True, "") when serving; (False, why) otherwise, e.g. an agent between sessions.
Readiness = Callable[[], tuple[bool, str]]


def parse_listen(address: str, *, public: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` to bind; a non-loopback host is refused unless ``public``."""
    problem = listen_problem(address, public=public)
    if problem:
        raise ValueError(f"metrics_listen={address!r} must be {problem}")
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def listen_problem(address: str, *, public: bool = False) -> str:
    """What ``address`` must be and is not, as the metrics port to bind ("": nothing)."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        return "HOST:PORT"
    if not public and not _loopback(host):
        return (
            "a loopback address: the metrics port is plain HTTP outside mTLS, and "
            "metrics_public (--metrics-public) exposes it"
        )
    return ""


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it could resolve anywhere
        return False


class MetricsServer:
    """Serves ``registry`` and the probes on a daemon thread until :meth:`close`."""

    def __init__(
        self, address: str, registry: CollectorRegistry, ready: Readiness, *, public: bool = False
    ) -> None:
        host, port = parse_listen(address, public=public)
        self.registry, self.ready = registry, ready
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, port), family=family, backlog=128)
        self.port: int = self._socket.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._active = 0
        self._busy = Throttle(interval_s=60.0)
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="metrics-http", daemon=True
        )
        self._thread.start()
        started.wait(timeout=10)
        log.info("[Metrics.Serve] listen=%s:%d paths=%s", host, self.port, ",".join(PATHS))

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._socket.close()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, sock=self._socket, limit=MAX_HEAD_BYTES)
        )
        started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._active >= MAX_CONNECTIONS:
            if self._busy.ready("busy"):
                log.warning(
                    "[Metrics.Busy] %d connections open: closing new ones until some end",
                    self._active,
                )
            writer.transport.abort()
            return
        self._active += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            method, path = _request_line(head)
            code, body, kind = await asyncio.to_thread(self._answer, method, path)
            writer.write(_response(code, body, kind, include_body=method != "HEAD"))
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # silent, slow, oversized or gone: closed, and the slot is free again
        finally:
            self._active -= 1
            writer.transport.abort()

    def _answer(self, method: str, path: str) -> tuple[int, bytes, str]:
        if not method:
            return 400, b"not an HTTP request\n", TEXT
        if method not in ("GET", "HEAD"):
            return 405, b"only GET and HEAD\n", TEXT
        if path == "/metrics":
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        if path == "/healthz":
            return 200, b"ok\n", TEXT
        if path == "/readyz":
            ok, why = self.ready()
            return (200 if ok else 503), f"{'ready' if ok else why}\n".encode(), TEXT
        return 404, f"not found: {', '.join(PATHS)}\n".encode(), TEXT


def _request_line(head: bytes) -> tuple[str, str]:
    """``(method, path)`` of a request head; ``("", "")`` for one that is not HTTP."""
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        return "", ""
    method, target = parts[0].decode("ascii", "replace"), parts[1].decode("ascii", "replace")
    return method, target.split("?", 1)[0]


def _response(code: int, body: bytes, kind: str, *, include_body: bool) -> bytes:
    """One HTTP/1.1 answer that closes the connection (HEAD: the headers of GET's)."""
    allow = "Allow: GET, HEAD\r\n" if code == 405 else ""
    head = (
        f"HTTP/1.1 {code} {REASONS.get(code, '')}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body)}\r\n{allow}Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + (body if include_body else b"")

"""The plain-HTTP side port: ``/metrics`` for Prometheus, ``/healthz`` and ``/readyz`` for
Kubernetes probes. It is outside mTLS, so it is off unless asked for, loopback unless the
operator says otherwise, and serves nothing secret (docs/operations.md, "Security model")."""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

# Ready: (True, "") when serving; (False, why) otherwise, e.g. an agent between sessions.
Readiness = Callable[[], tuple[bool, str]]


def parse_listen(address: str, *, public: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` to bind; a non-loopback host is refused unless ``public``."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics_listen={address!r} must be HOST:PORT")
    if not public and not _loopback(host):
        raise ValueError(
            f"metrics_listen={address!r} is not a loopback address; the metrics port is "
            "plain HTTP outside mTLS: pass metrics_public (--metrics-public) to expose it"
        )
    return host, int(port)


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
        handler = _handler(registry, ready)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )
        self._thread.start()
        log.info("[Metrics.Serve] listen=%s:%d paths=/metrics,/healthz,/readyz", host, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _handler(registry: CollectorRegistry, ready: Readiness) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._reply(200, b"ok\n")
            elif path == "/readyz":
                ok, why = ready()
                self._reply(200 if ok else 503, f"{'ready' if ok else why}\n".encode())
            else:
                self._reply(404, b"not found: /metrics, /healthz, /readyz\n")

        def _reply(self, code: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.debug("[Metrics.Request] " + format, *args)

    return Handler

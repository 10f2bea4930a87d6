"""Wiring the coordinator together: task, federation, TLS, gRPC server, round driver."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc

from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.federation import Federation
from skyfed.coordinator.limits import StreamLimits
from skyfed.coordinator.probe import ProbeEcho
from skyfed.coordinator.revocation import RevocationWatch
from skyfed.coordinator.security import PeerAuthenticator, RotatingServerCredentials
from skyfed.coordinator.service import serve_federation
from skyfed.fingerprint import model_spec
from skyfed.tasks import load_task

log = logging.getLogger(__name__)

# Room for one chunk of data plus its envelope.
ENVELOPE_BYTES = 64 << 10
MAX_SESSIONS = 256


@dataclass
class Running:
    """A serving coordinator: its real port, its federation, and its driver thread."""

    server: grpc.Server
    port: int
    federation: Federation
    driver: threading.Thread


def build_federation(config: CoordinatorConfig) -> Federation:
    task = load_task(config.task)
    model = task.build_model(config.seed)
    named = list(model.named_parameters())
    weights = [p.detach().clone().float().contiguous() for _, p in named]
    return Federation(config, model_spec(named), weights)


@contextlib.contextmanager
def run_server(config: CoordinatorConfig) -> Iterator[Running]:
    """Serve until the block exits; binds ``config.listen`` (port 0 picks one)."""
    federation = build_federation(config)
    assert config.cert and config.key and config.ca  # checked by CoordinatorConfig
    creds = RotatingServerCredentials(config.cert, config.key, config.ca).credentials()
    limit = config.max_chunk_bytes + ENVELOPE_BYTES
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=MAX_SESSIONS + 8, thread_name_prefix="rpc"),
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            # gRPC sets SO_REUSEPORT by default: a second coordinator on the same port would
            # start silently and split the agents between the two. Binding must fail instead.
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=MAX_SESSIONS,
    )
    auth = PeerAuthenticator(config.crl, config.ca)
    limits = StreamLimits(config.max_streams_per_identity, config.hello_timeout_s)
    serve_federation(server, federation, auth, limits)
    port = server.add_secure_port(config.listen, creds)
    if port == 0:
        raise OSError(f"cannot listen on {config.listen}")
    echo = _start_echo(config)
    federation.links.echo = echo
    server.start()
    watch = None
    if auth.revocations is not None:
        watch = RevocationWatch(auth.revocations, limits, federation).start()
    driver = threading.Thread(target=_drive, args=(federation,), name="rounds", daemon=True)
    driver.start()
    log.info("[Coordinator.Serve] listen=%s port=%d task=%s", config.listen, port, config.task)
    if config.port_file is not None:
        config.port_file.write_text(f"{port}\n")
    try:
        yield Running(server, port, federation, driver)
    finally:
        federation.stop()
        driver.join(timeout=10)
        for session in list(federation.sessions.values()):
            session.close()  # ends each stream's generator, so stop() does not wait on it
        server.stop(grace=2).wait(timeout=10)
        if watch is not None:
            watch.close()
        if echo is not None:
            echo.close()
        if federation.failure is None:
            federation.write_status()


def _drive(federation: Federation) -> None:
    """The round driver's thread. A failure is kept in ``federation.failure`` and ends the
    driver, so the process ends non-zero with the reason (``coordinator/cli.py``) rather
    than serving on with no rounds: a supervisor restarts it from the last checkpoint."""
    try:
        federation.run()
    except Exception as exc:  # noqa: BLE001 - any failure here ends the process
        federation.failure = exc
        log.critical("[Coordinator.Rounds] round driver failed: %r", exc, exc_info=True)


def _start_echo(config: CoordinatorConfig) -> ProbeEcho | None:
    """The loss probe's UDP echo on the listen host, unless ``probe_port`` is -1."""
    if config.probe_port < 0:
        return None
    host = config.listen.rsplit(":", 1)[0].strip("[]") or "0.0.0.0"
    return ProbeEcho(host, config.probe_port).start()

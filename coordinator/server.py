"""Wiring the coordinator together: task, federation, TLS, gRPC server, round driver."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client.registry import CollectorRegistry

from skyfed.coordinator.calls import CallGuard
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.export import export_weights
from skyfed.coordinator.federation import Federation, resume, round_rules
from skyfed.coordinator.limits import CallLimits, calls_allowed
from skyfed.coordinator.model import Model
from skyfed.coordinator.observe import Observer
from skyfed.coordinator.probe import ProbeEcho
from skyfed.coordinator.replicas.followers import Followers, ReleaseRefused
from skyfed.coordinator.revocation import RevocationWatch
from skyfed.coordinator.security import PeerAuthenticator, RotatingServerCredentials
from skyfed.coordinator.service import Leadership, serve_federation
from skyfed.fingerprint import model_spec
from skyfed.metrics.coordinator import CoordinatorCollector
from skyfed.metrics.http import MetricsServer
from skyfed.netinfo import log_congestion_control, log_send_buffering
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
    observer: Observer
    metrics_port: int | None = None
    """The bound port of ``metrics_listen``; None when it is off."""


def initial_model(config: CoordinatorConfig) -> Model:
    """The federation's model: the task's initial weights for ``seed``, resumed from the
    newest checkpoint in ``checkpoint_dir`` that verifies."""
    task = load_task(config.task)
    module = task.build_model(config.seed)
    named = list(module.named_parameters())
    # The parameters' own memory (float32 already): a clone would double the peak at start.
    weights = [p.detach().float().contiguous() for _, p in named]
    spec = model_spec(named)
    del module, named
    model = Model(spec, weights, round_rules(config))
    resume(model, config.checkpoints.checkpoint_dir)
    return model


def build_federation(
    config: CoordinatorConfig, model: Model | None = None, term: int = 0
) -> Federation:
    return Federation(config, model or initial_model(config), term)


@contextlib.contextmanager
def run_server(
    config: CoordinatorConfig,
    leadership: Leadership | None = None,
    *,
    model: Model | None = None,
    replication: Followers | None = None,
) -> Iterator[Running]:
    """Serve until the block exits; binds ``config.transport.listen`` (port 0 picks one). A replica
    passes its ``leadership``: sessions are admitted only while it leads, and every
    message carries its term; ``model``, the state it followed as a standby, and
    ``replication``, the standbys that follow it (``coordinator/replicas/serve.py``)."""
    term = leadership.term if leadership is not None else 0
    federation = build_federation(config, model, term)
    if replication is not None:
        federation.replication = replication.bind(federation)
    # What can refuse to start (a missing extra, a taken metrics port) does so before the
    # federation's port opens; /readyz answers 503 until the driver runs.
    observer = Observer(federation, config)
    driver = threading.Thread(target=_drive, args=(federation,), name="rounds", daemon=True)
    metrics = _start_metrics(config, observer, driver)
    assert (
        config.transport.cert and config.transport.key and config.transport.ca
    )  # checked by CoordinatorConfig
    creds = RotatingServerCredentials(
        config.transport.cert, config.transport.key, config.transport.ca
    ).credentials()
    limit = config.transport.max_chunk_bytes + ENVELOPE_BYTES
    auth = PeerAuthenticator(config.transport.crl, config.transport.ca)
    per_identity = calls_allowed(
        config.transport.max_streams_per_identity, config.streams.max_streams, MAX_SESSIONS
    )
    limits = CallLimits(per_identity, sessions=config.transport.max_streams_per_identity)
    calls = CallGuard(auth, limits, config.transport.hello_timeout_s, federation.refused)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=MAX_SESSIONS + 8, thread_name_prefix="rpc"),
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.bdp_probe", 1),  # windows past the link's BDP (docs/wan.md#http2-windows)
            # gRPC sets SO_REUSEPORT by default: a second coordinator on the same port would
            # start silently and split the agents between the two. Binding must fail instead.
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=MAX_SESSIONS,
        interceptors=[calls],  # every call, the health service's too
    )
    serve_federation(server, federation, auth, calls, leadership)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_secure_port(config.transport.listen, creds)
    if port == 0:
        raise OSError(f"cannot listen on {config.transport.listen}")
    echo = _start_echo(config)
    federation.links.echo = echo
    server.start()
    # What was built so far lives as long as the process: out of the cyclic collector's
    # sight (its full passes over torch's objects cost measurable CPU, docs/scale.md).
    gc.freeze()
    watch = None
    if auth.revocations is not None:
        watch = RevocationWatch(auth.revocations, calls).start()
    _set_health(health_servicer, health_pb2.HealthCheckResponse.SERVING)
    driver.start()
    observer.start()
    log.info(
        "[Coordinator.Serve] listen=%s port=%d task=%s", config.transport.listen, port, config.task
    )
    log_congestion_control(None, "coordinator")  # each session logs its route's (docs/wan.md)
    log_send_buffering("coordinator", striping=False)  # warned at a first N > 1 (links.py)
    if config.transport.port_file is not None:
        config.transport.port_file.write_text(f"{port}\n")
    try:
        yield Running(server, port, federation, driver, observer, metrics.port if metrics else None)
    finally:
        federation.stop()
        driver.join(timeout=10)
        _set_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
        federation.rounds.close_checkpoints()
        for session in list(federation.admission.sessions.values()):
            session.close()  # ends each stream's generator, so stop() does not wait on it
        server.stop(grace=2).wait(timeout=10)
        if watch is not None:
            watch.close()
        if echo is not None:
            echo.close()
        observer.close()
        _export(config, federation)
        if metrics is not None:
            metrics.close()
        if federation.failure is None:
            federation.write_status()


def _drive(federation: Federation) -> None:
    """The round driver's thread. A failure is kept in ``federation.failure`` and ends the
    driver, so the process ends non-zero with the reason (``coordinator/cli.py``) rather
    than serving on with no rounds: a supervisor restarts it from the last checkpoint."""
    try:
        federation.run()
    except ReleaseRefused as exc:  # a replica's term ended: it becomes a standby again
        federation.failure = exc
        log.warning("[Coordinator.Rounds] %s", exc)
    except Exception as exc:  # noqa: BLE001 - any failure here ends the process
        federation.failure = exc
        log.critical("[Coordinator.Rounds] round driver failed: %r", exc, exc_info=True)


SERVICES = ("", "skyfed.v1.Federation")  # "": the whole server, as grpc.health.v1 defines it


def _set_health(servicer: health.HealthServicer, state: int) -> None:
    for service in SERVICES:
        servicer.set(service, state)


def _start_metrics(
    config: CoordinatorConfig, observer: Observer, driver: threading.Thread
) -> MetricsServer | None:
    """``/metrics``, ``/healthz``, ``/readyz`` on ``metrics_listen``, if set."""
    if not config.metrics.metrics_listen:
        return None
    registry = CollectorRegistry()
    registry.register(CoordinatorCollector(observer.snapshot))

    def ready() -> tuple[bool, str]:
        return (True, "") if driver.is_alive() else (False, "the round driver has stopped")

    return MetricsServer(
        config.metrics.metrics_listen, registry, ready, public=config.metrics.metrics_public
    )


def _export(config: CoordinatorConfig, federation: Federation) -> None:
    """``--export FILE``: the final weights as a plain state_dict (skyfed.coordinator.export)."""
    if config.checkpoints.export is None:
        return
    with federation.cond:
        model = federation.model
        round_, weights = model.round - 1, [w.clone() for w in model.weights]
    if round_ < 0:  # the initial weights are no trained model (coordinator/cli.py says so)
        log.warning(
            "[Coordinator.Export] out=%s skipped: no round was applied", config.checkpoints.export
        )
        return
    meta = export_weights(
        weights, config.checkpoints.export, task=config.task, round_=round_, seed=config.seed
    )
    log.info(
        "[Coordinator.Export] out=%s round=%d digest=%s",
        config.checkpoints.export,
        round_,
        meta["weights_digest"][:16],
    )


def _start_echo(config: CoordinatorConfig) -> ProbeEcho | None:
    """The loss probe's UDP echo on the listen host, unless ``probe_port`` is -1."""
    if config.transport.probe_port < 0:
        return None
    host = config.transport.listen.rsplit(":", 1)[0].strip("[]") or "0.0.0.0"
    return ProbeEcho(host, config.transport.probe_port).start()

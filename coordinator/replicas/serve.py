"""A coordinator replica's life: standby until elected, leader until deposed or done.

A standby serves its port with :mod:`standby` (agents are pointed at the leader) and
keeps its own copy of the federation's state in step with the leader's (:mod:`replay`).
It campaigns only while that state holds the last released round (:mod:`record`). Once
etcd elects it, the standby's port closes and the coordinator proper starts on the same
port with the state it followed (``coordinator/server.py``), admitting sessions only while
the replica leads and streaming its rounds to the standbys that follow it
(:mod:`followers`). Deposed (its lease no longer proven alive, or its release refused
under a newer term), it closes every session at once, stops, and becomes a standby
again (docs/failover.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import socket
import threading
import time
from typing import Literal

import grpc

from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.model import Model
from skyfed.coordinator.replicas.election import Elector
from skyfed.coordinator.replicas.etcd import Etcd, EtcdError, EtcdUnavailable, TlsFiles
from skyfed.coordinator.replicas.followers import Followers, ReleaseRefused
from skyfed.coordinator.replicas.record import Record
from skyfed.coordinator.replicas.replay import Replay
from skyfed.coordinator.replicas.settings import parse_endpoints
from skyfed.coordinator.replicas.standby import Standing, standby_server
from skyfed.coordinator.server import Running, initial_model, run_server
from skyfed.metrics.http import MetricsServer

log = logging.getLogger(__name__)

POLL_S = 0.05
"""How often the leader looks at its standing: far inside the lease's guard."""
ETCD_TIMEOUT_S = 2.0

Outcome = Literal["stopped", "deposed", "done", "failed"]


def serve_replica(config: CoordinatorConfig, stop: threading.Event) -> int:
    """Serve as replica ``config.replicas.replica`` until ``stop``, or the federation is done (0) or
    its round driver failed (1)."""
    etcd = connect(config)
    record = Record(etcd, config.replicas.etcd_prefix, config.replicas.replica)
    elector = Elector(
        etcd,
        prefix=config.replicas.etcd_prefix,
        replica=config.replicas.replica,
        address="",  # known once the port is bound
        ttl_s=config.replicas.lease_ttl_s,
    )
    life = _Life(config, etcd, record, elector, Standing(elector, record))
    model = initial_model(config)
    try:
        while not stop.is_set():
            model, replay = life.stand_by(model, stop)
            if replay is None:
                break
            if _finished(etcd, config):
                return 0
            outcome, model = life.lead(model, replay, stop)
            if outcome in ("done", "failed"):
                return 0 if outcome == "done" else 1
        return 0
    finally:
        term = elector.term
        if term is not None:
            record.resigning(term)
        elector.close()  # after the coordinator stopped: no overlap with a successor


@dataclasses.dataclass
class _Life:
    """What a replica keeps across its terms: its etcd, its election, its port."""

    config: CoordinatorConfig
    etcd: Etcd
    record: Record
    elector: Elector
    standing: Standing

    def __post_init__(self) -> None:
        self.listen = self.config.transport.listen

    def stand_by(self, model: Model, stop: threading.Event) -> tuple[Model, Replay | None]:
        """Replay the leader's rounds on ``model`` until elected (the replay, which says
        how the old leader went) or ``stop`` (None)."""
        config, elector, record = self.config, self.elector, self.record
        replay = Replay(config, model, elector)
        elector.eligible = lambda fresh: record.eligible(
            replay.held, replay.model.weights_digest, elector, fresh
        )
        self.standing.replay, self.standing.followers = replay, None
        with (
            standby_server(config, self.listen, self.standing) as port,
            _standby_probes(config, self.standing),
        ):
            self.listen = f"{self.listen.rpartition(':')[0]}:{port}"  # one port, every role
            replay.start()
            if not elector.address:
                elector.address = config.replicas.advertise or _advertised(self.listen)
                elector.start()
            elected = elector.wait_leading(stop)
            model = replay.stop()  # a round close in progress finishes first
        self.standing.replay = None
        return model, replay if elected else None

    def lead(self, model: Model, replay: Replay, stop: threading.Event) -> tuple[Outcome, Model]:
        """Lead with the state ``model`` replayed until the term ends; the outcome and
        the model to stand by with."""
        config, elector, record = self.config, self.elector, self.record
        followers = Followers(
            elector.term or 0,
            config.replicas.replica_ack_timeout_s,
            lambda round_, digest: record.release(elector, round_, digest),
        )
        self.standing.followers = followers
        bound = dataclasses.replace(config.transport, listen=self.listen)
        served = dataclasses.replace(config, transport=bound)
        with run_server(served, self.standing, model=model, replication=followers) as running:
            _took_over(running, record, elector, replay)
            outcome = _lead(running, elector, stop)
        if outcome == "done":
            _mark_finished(self.etcd, config, running)
        return outcome, _kept(running, config)


def _took_over(running: Running, record: Record, elector: Elector, replay: Replay) -> None:
    """The new leader, serving: its wall time counts from the federation's start, and its
    failover is recorded, logged and marked in the run's history."""
    fed = running.federation
    fed.started_at = time.monotonic() - (time.time() - record.started_unix_s())
    with fed.cond:
        held = fed.model.round - 1
    failover = record.took_over(elector, replay.lost_at, replay.last_heard, held)
    if failover is None:
        return
    log.warning(
        "[Coordinator.Failover] term=%d replica=%s previous=%s cause=%s duration_s=%.2f "
        "round=%d lost_rounds=%d",
        failover.term,
        failover.replica,
        failover.previous or "-",
        failover.cause,
        failover.duration_s,
        failover.round,
        failover.lost_rounds,
    )
    wall_s = time.monotonic() - fed.started_at
    running.observer.failover({**dataclasses.asdict(failover), "wall_s": wall_s})


def _kept(running: Running, config: CoordinatorConfig) -> Model:
    """The model a deposed leader goes on following with: its own, unless its round
    driver never stopped (then its tensors may be half changed: the checkpoint's)."""
    if running.driver.is_alive():
        log.warning("[Coordinator.Replica] the round driver did not stop: resuming from disk")
        return initial_model(config)
    return running.federation.model


def connect(config: CoordinatorConfig) -> Etcd:
    """The etcd cluster of ``config``; over https the replica's own certificate."""
    assert config.transport.cert and config.transport.key  # checked by CoordinatorConfig
    tls = (
        None
        if config.replicas.etcd_ca is None
        else TlsFiles(config.replicas.etcd_ca, config.transport.cert, config.transport.key)
    )
    return Etcd(parse_endpoints(config.replicas.etcd), tls=tls, timeout_s=ETCD_TIMEOUT_S)


def _lead(running: Running, elector: Elector, stop: threading.Event) -> Outcome:
    """Watch the term: the moment it ends, every session ends, before anything else."""
    fed = running.federation
    term = elector.term
    log.info("[Coordinator.Replica] leading replica=%s term=%s", elector.replica, term)
    while not stop.wait(POLL_S):
        refused = isinstance(fed.failure, ReleaseRefused)
        if not elector.leading or refused:
            for session in list(fed.admission.sessions.values()):
                session.close(grpc.StatusCode.UNAVAILABLE, "the coordinator replica was deposed")
            log.warning("[Coordinator.Replica] deposed: term %s ended", term)
            return "deposed"
        if not running.driver.is_alive():
            return "failed" if fed.failure is not None else "done"
    return "stopped"


def _finished_key(config: CoordinatorConfig) -> bytes:
    return f"{config.replicas.etcd_prefix}/finished".encode()


def _finished(etcd: Etcd, config: CoordinatorConfig) -> bool:
    """The federation's last round is done (a leader said so): nothing to lead."""
    try:
        done = etcd.get_prefix(_finished_key(config))
    except (EtcdUnavailable, EtcdError) as exc:
        log.warning("[Coordinator.Replica] cannot read %s: %s", _finished_key(config), exc)
        return False
    if done:
        log.info("[Coordinator.Replica] the federation has finished: %s", done[0].value.decode())
    return bool(done)


def _mark_finished(etcd: Etcd, config: CoordinatorConfig, running: Running) -> None:
    """Tell the standbys the run is over, so none starts it again when this one resigns."""
    with running.federation.cond:
        last = running.federation.model.round - 1
    value = json.dumps({"round": last, "replica": config.replicas.replica}).encode()
    with contextlib.suppress(EtcdUnavailable, EtcdError):
        etcd.put(_finished_key(config), value)


@contextlib.contextmanager
def _standby_probes(config: CoordinatorConfig, standing: Standing):  # noqa: ANN202
    """``/healthz`` alive, ``/readyz`` 503 on a standby's metrics port (a Kubernetes
    Service sends agents to the ready replica, the leader), and ``/metrics`` with the
    replicas' families."""
    if not config.metrics.metrics_listen:
        yield
        return
    from prometheus_client.registry import CollectorRegistry

    from skyfed.metrics.coordinator import ReplicaCollector

    def ready() -> tuple[bool, str]:
        return False, f"replica {config.replicas.replica} is a standby"

    registry = CollectorRegistry()
    registry.register(
        ReplicaCollector(lambda: {"replicas": dataclasses.asdict(standing.replica_set())})
    )
    metrics = config.metrics
    server = MetricsServer(metrics.metrics_listen, registry, ready, public=metrics.metrics_public)
    try:
        yield
    finally:
        server.close()


def _advertised(listen: str) -> str:
    """HOST:PORT of ``listen`` as others dial it: a wildcard host becomes this host's name."""
    host, _, port = listen.rpartition(":")
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"

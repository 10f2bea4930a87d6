"""A coordinator replica's life: standby until elected, leader until deposed or done.

A standby serves its port with :mod:`standby` (agents are pointed at the leader). Once
etcd elects it, the standby's port closes and the coordinator proper starts on the same
port (``coordinator/server.py``), admitting sessions only while the replica leads. Deposed
(its lease no longer proven alive), it closes every session at once, stops, and becomes a
standby again; its round state is its own checkpoint directory's (docs/failover.md says
what a successor needs, and how it will get it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import socket
import threading
from typing import Literal

import grpc

from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.replicas.election import Elector
from skyfed.coordinator.replicas.etcd import Etcd, EtcdError, EtcdUnavailable, TlsFiles
from skyfed.coordinator.replicas.settings import parse_endpoints
from skyfed.coordinator.replicas.standby import Standing, standby_server
from skyfed.coordinator.server import Running, run_server
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
    elector = Elector(
        etcd,
        prefix=config.replicas.etcd_prefix,
        replica=config.replicas.replica,
        address="",  # known once the port is bound
        ttl_s=config.replicas.lease_ttl_s,
    )
    standing = Standing(elector)
    listen = config.transport.listen
    try:
        while not stop.is_set():
            with (
                standby_server(config, listen, standing) as port,
                _standby_probes(config, standing),
            ):
                listen = f"{listen.rpartition(':')[0]}:{port}"  # the same port in every role
                if not elector.address:
                    elector.address = config.replicas.advertise or _advertised(listen)
                    elector.start()
                if not elector.wait_leading(stop):
                    break
            if _finished(etcd, config):
                return 0
            bound = dataclasses.replace(config.transport, listen=listen)
            with run_server(dataclasses.replace(config, transport=bound), standing) as running:
                outcome = _lead(running, elector, stop)
            if outcome == "done":
                _mark_finished(etcd, config, running)
                return 0
            if outcome == "failed":
                return 1
        return 0
    finally:
        elector.close()  # after the coordinator stopped: no overlap with a successor


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
        if not elector.leading:
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
    """``/healthz`` alive, ``/readyz`` 503 on a standby's metrics port: a Kubernetes
    Service sends agents to the ready replica, the leader."""
    if not config.metrics.metrics_listen:
        yield
        return
    from prometheus_client.registry import CollectorRegistry

    def ready() -> tuple[bool, str]:
        return False, f"replica {config.replicas.replica} is a standby"

    server = MetricsServer(
        config.metrics.metrics_listen,
        CollectorRegistry(),
        ready,
        public=config.metrics.metrics_public,
    )
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

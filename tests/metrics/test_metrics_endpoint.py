"""The side port of a real in-process coordinator: /metrics, the probes, grpc.health.v1."""

from __future__ import annotations

import contextlib
import resource
import socket
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from skyfed.coordinator.config import CoordinatorConfig
from skyfed.metrics.catalog import COORDINATOR, of_role
from skyfed.metrics.http import REQUEST_TIMEOUT_S, parse_listen
from skyfed.proto import federation_pb2 as pb
from tests.conftest import credentials


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_metrics_port_serves_every_coordinator_metric_before_the_first_round(serve):
    running = serve(metrics_listen="127.0.0.1:0", min_agents=3)
    code, text = get(running.metrics_port, "/metrics")
    assert code == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # The parser drops the counters' _total from the family name.
    served = {name.removesuffix("_total") for name in families}
    assert {m.name.removesuffix("_total") for m in of_role(COORDINATOR)} <= served
    (expected,) = families["skyfed_agents_expected"].samples
    assert expected.value == 3


def test_probes_say_healthy_and_ready_while_serving(serve):
    running = serve(metrics_listen="127.0.0.1:0")
    assert get(running.metrics_port, "/healthz") == (200, "ok\n")
    assert get(running.metrics_port, "/readyz") == (200, "ready\n")
    assert get(running.metrics_port, "/nothing")[0] == 404


def test_metrics_port_is_off_by_default(serve):
    assert serve().metrics_port is None


@pytest.mark.parametrize("address", ["0.0.0.0:9100", "10.1.2.3:9100", "metrics.example:9100"])
def test_non_loopback_metrics_address_is_refused_unless_public(pki, address):
    with pytest.raises(ValueError, match="must be a loopback address.*metrics_public"):
        CoordinatorConfig.from_flat(certs=pki.directory, metrics_listen=address)
    assert CoordinatorConfig.from_flat(
        certs=pki.directory, metrics_listen=address, metrics_public=True
    )


@pytest.mark.parametrize("address", ["9100", ":9100", "localhost:port", "[::1]:99999"])
def test_malformed_metrics_address_is_a_clear_error(address):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(address)


def test_loopback_addresses_need_no_opt_in():
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:9100") == ("::1", 9100)
    assert parse_listen("localhost:9100") == ("localhost", 9100)


def test_grpc_health_answers_serving_over_mtls(serve, pki):
    running = serve()
    creds = credentials(pki.directory, "coordinator")
    with grpc.secure_channel(f"localhost:{running.port}", creds) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "skyfed.v1.Federation"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(health_pb2.HealthCheckRequest(service="no.Such"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_grpc_health_needs_a_client_certificate(serve, pki):
    running = serve()
    creds = grpc.ssl_channel_credentials(root_certificates=(pki.directory / "ca.crt").read_bytes())
    with grpc.secure_channel(f"localhost:{running.port}", creds) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_refusals_are_counted_by_status_code(serve, pki, raw_agent):
    running = serve(metrics_listen="127.0.0.1:0")
    bad = raw_agent(running.port, "aws-1")
    bad.send(chunk=pb.Chunk(round=0))  # before hello
    assert bad.ended()[0] == grpc.StatusCode.INVALID_ARGUMENT
    pki.revoke("gcp-1")
    revoked = raw_agent(running.port, "gcp-1")
    assert revoked.ended()[0] == grpc.StatusCode.UNAUTHENTICATED
    _, text = get(running.metrics_port, "/metrics")
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "skyfed_refusals"]
    counts = {s.labels["code"]: s.value for s in family.samples}
    assert counts == {"INVALID_ARGUMENT": 1, "UNAUTHENTICATED": 1}


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_head_answers_as_get_without_a_body(serve, path):
    running = serve(metrics_listen="127.0.0.1:0")
    request = urllib.request.Request(
        f"http://127.0.0.1:{running.metrics_port}{path}", method="HEAD"
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.status == 200
        assert int(reply.headers["Content-Length"]) > 0
        assert reply.read() == b""


def test_other_methods_are_refused_with_405(serve):
    running = serve(metrics_listen="127.0.0.1:0")
    request = urllib.request.Request(
        f"http://127.0.0.1:{running.metrics_port}/healthz", data=b"x", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 405
    assert refused.value.headers["Allow"] == "GET, HEAD"


IDLE_CONNECTIONS = 2000


def test_idle_connections_hold_no_threads_and_are_closed(serve):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 3 * IDLE_CONNECTIONS:  # both ends live in this process
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 3 * IDLE_CONNECTIONS), hard))
    running = serve(metrics_listen="127.0.0.1:0")
    threads = threading.active_count()
    idle = [
        socket.create_connection(("127.0.0.1", running.metrics_port), timeout=10)
        for _ in range(IDLE_CONNECTIONS)
    ]
    try:
        time.sleep(1)
        assert threading.active_count() - threads < 20  # not a thread per connection
        started = time.monotonic()
        for conn in idle:  # each is closed by the server, none sent a byte
            conn.settimeout(max(0.1, REQUEST_TIMEOUT_S + 5 - (time.monotonic() - started)))
            with contextlib.suppress(ConnectionResetError):  # closed past the bound: reset
                assert conn.recv(1) == b""
        assert time.monotonic() - started < REQUEST_TIMEOUT_S + 5
        assert get(running.metrics_port, "/healthz") == (200, "ok\n")
    finally:
        for conn in idle:
            conn.close()

"""Who may talk to the coordinator: each refusal asserts the exact status a client sees."""

from __future__ import annotations

import datetime as dt
import shutil
import socket
import ssl
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from skyfed.certs.testing import make_federation
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import federation_pb2_grpc as pb_grpc

from .. import conftest  # noqa: TID252 - shared helpers live beside the fixtures
from .test_bad_input import hello


def status_call(port: int, creds: grpc.ChannelCredentials) -> tuple[grpc.StatusCode, str]:
    with grpc.secure_channel(f"localhost:{port}", creds) as channel:
        try:
            pb_grpc.FederationStub(channel).Status(pb.StatusRequest(), timeout=10)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def self_signed(directory: Path, name: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(f"spiffe://skyfed.local/cloud/aws/agent/{name}")]
            ),
            False,
        )
        .sign(key, hashes.SHA256())
    )
    (directory / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def test_operator_with_valid_certificate_is_served(serve, pki):
    running = serve()
    assert (
        status_call(running.port, conftest.credentials(pki.directory, "ops"))[0]
        == grpc.StatusCode.OK
    )


def test_client_without_certificate_is_refused_at_handshake(serve, pki):
    running = serve()
    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca_cert_path.read_bytes())
    code, details = status_call(running.port, creds)
    assert code == grpc.StatusCode.UNAVAILABLE, details


def test_certificate_from_another_ca_is_refused_at_handshake(serve, pki, tmp_path):
    running = serve()
    other = make_federation(tmp_path / "other")
    creds = conftest.credentials(other.directory, "aws-1", ca=pki.ca_cert_path)
    assert status_call(running.port, creds)[0] == grpc.StatusCode.UNAVAILABLE


def test_self_signed_certificate_is_refused_at_handshake(serve, pki, tmp_path):
    running = serve()
    self_signed(tmp_path, "rogue")
    creds = conftest.credentials(tmp_path, "rogue", ca=pki.ca_cert_path)
    assert status_call(running.port, creds)[0] == grpc.StatusCode.UNAVAILABLE


def test_expired_certificate_is_refused_at_handshake(serve, pki):
    running = serve()
    now = dt.datetime.now(dt.UTC)
    pki.issue_agent(
        "aws", "stale", not_before=now - dt.timedelta(days=10), not_after=now - dt.timedelta(days=1)
    )
    creds = conftest.credentials(pki.directory, "stale")
    assert status_call(running.port, creds)[0] == grpc.StatusCode.UNAVAILABLE


def test_revoked_identity_is_refused_without_restart(serve, pki):
    running = serve()
    creds = conftest.credentials(pki.directory, "ops")
    assert status_call(running.port, creds)[0] == grpc.StatusCode.OK
    pki.revoke("ops")
    code, details = status_call(running.port, creds)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert "revoked" in details


def test_revoked_agent_cannot_open_a_session(serve, pki, raw_agent):
    running = serve()
    pki.revoke("gcp-1")
    agent = raw_agent(running.port, "gcp-1")
    agent.send(hello=hello("gcp", "gcp-1"))
    assert agent.ended()[0] == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    ("cloud", "name"),
    [("gcp", "aws-1"), ("aws", "aws-2"), ("azure", "azure-1")],
    ids=["other-cloud", "other-name", "both"],
)
def test_hello_that_disagrees_with_the_certificate_is_permission_denied(
    serve, raw_agent, cloud, name
):
    running = serve()
    agent = raw_agent(running.port, "aws-1")
    agent.send(hello=hello(cloud, name))
    code, details = agent.ended()
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "certificate says cloud='aws' name='aws-1'" in details


def test_coordinator_certificate_cannot_join_as_an_agent(serve, raw_agent):
    running = serve()
    agent = raw_agent(running.port, "coordinator")
    agent.send(hello=hello("aws", "coordinator"))
    assert agent.ended()[0] == grpc.StatusCode.PERMISSION_DENIED


def test_server_and_ca_rotate_without_restart(serve, pki, tmp_path):
    live = tmp_path / "live"
    shutil.copytree(pki.directory, live)
    running = serve(certs=live)
    old = conftest.credentials(pki.directory, "ops")
    assert status_call(running.port, old)[0] == grpc.StatusCode.OK
    rotated = make_federation(tmp_path / "rotated")
    for name in ("ca.crt", "crl.pem", "coordinator.crt", "coordinator.key"):
        shutil.copy(rotated.directory / name, live / name)
    new = conftest.credentials(rotated.directory, "ops")
    assert status_call(running.port, new)[0] == grpc.StatusCode.OK
    assert status_call(running.port, old)[0] == grpc.StatusCode.UNAVAILABLE


def test_coordinator_negotiates_tls_1_3(serve, pki):
    running = serve()
    context = ssl.create_default_context(cafile=str(pki.ca_cert_path))
    context.load_cert_chain(pki.directory / "aws-1.crt", pki.directory / "aws-1.key")
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", running.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        assert tls.version() == "TLSv1.3"

"""Who the coordinator believes: the federation's trust domain, leaves issued directly by
its CA, and admin calls only for operators. Each refusal asserts the status a client sees."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from skyfed.certs import templates
from skyfed.certs.authority import CertificateAuthority
from skyfed.certs.identity import Identity, IdentityError

from .. import conftest  # noqa: TID252 - shared helpers live beside the fixtures
from .test_mtls import status_call


def ca_material(pki: CertificateAuthority) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = serialization.load_pem_private_key((pki.directory / "ca.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return pki.certificate, key


def write_pair(directory: Path, name: str, chain: list[x509.Certificate], key) -> None:
    pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain)
    (directory / f"{name}.crt").write_bytes(pem)
    (directory / f"{name}.key").write_bytes(templates.pem_private_key(key))


def validity() -> tuple[dt.datetime, dt.datetime]:
    now = dt.datetime.now(dt.UTC)
    return now - dt.timedelta(hours=1), now + dt.timedelta(days=1)


def leaf(issuer: x509.Certificate, issuer_key, identity: Identity):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = templates.leaf_certificate(
        issuer,
        issuer_key,
        identity,
        key.public_key(),
        templates.subject_alt_names(identity),
        [ExtendedKeyUsageOID.CLIENT_AUTH],
        validity(),
    )
    return cert, key


def sub_ca(ca: x509.Certificate, ca_key) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A CA:true, pathlen 0 intermediate the federation CA signed (the `certs` tool never does)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = validity()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rogue sub-CA")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def test_a_ca_signed_certificate_of_another_trust_domain_is_refused(serve, pki):
    ca, ca_key = ca_material(pki)
    cert, key = leaf(ca, ca_key, Identity.agent("evil.example", cloud="aws", name="aws-9"))
    write_pair(pki.directory, "evil", [cert], key)
    running = serve()
    code, details = status_call(running.port, conftest.credentials(pki.directory, "evil"))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert "evil.example" in details


def test_a_leaf_under_a_sub_ca_of_the_federation_ca_is_refused(serve, pki):
    ca, ca_key = ca_material(pki)
    inter, inter_key = sub_ca(ca, ca_key)
    identity = Identity.agent(pki.trust_domain, cloud="aws", name="aws-9")
    cert, key = leaf(inter, inter_key, identity)
    write_pair(pki.directory, "chained", [cert, inter], key)
    running = serve()
    code, details = status_call(running.port, conftest.credentials(pki.directory, "chained"))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert "directly" in details


def test_status_needs_an_operator_and_agents_get_permission_denied(serve, pki):
    running = serve()
    code, details = status_call(running.port, conftest.credentials(pki.directory, "aws-1"))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "certs issue admin" in details
    assert status_call(running.port, conftest.credentials(pki.directory, "ops"))[0] == (
        grpc.StatusCode.OK
    )


@pytest.mark.parametrize("role", ["agent", "admin"])
def test_the_coordinators_name_is_reserved_for_the_coordinator(role):
    with pytest.raises(IdentityError, match="reserved for the coordinator"):
        Identity(
            trust_domain="skyfed.local",
            role=role,
            name="coordinator",
            cloud="aws" if role == "agent" else None,
        )


def test_an_admin_identity_round_trips_through_its_uri(pki):
    issued = pki.issue_admin("ops2")
    assert issued.identity.uri == f"spiffe://{pki.trust_domain}/admin/ops2"
    assert Identity.parse(issued.identity.uri) == issued.identity


def test_a_second_coordinator_on_the_same_port_fails_to_start(serve):
    running = serve()
    with pytest.raises((OSError, RuntimeError), match=str(running.port)):
        serve(listen=f"127.0.0.1:{running.port}")


def tls_handshake(port: int, pki, *, version: ssl.TLSVersion, ciphers: str | None = None):
    """Handshake with the coordinator as a TLS client capped at ``version``."""
    context = ssl.create_default_context(cafile=str(pki.ca_cert_path))
    context.load_cert_chain(pki.directory / "aws-1.crt", pki.directory / "aws-1.key")
    context.set_alpn_protocols(["h2"])
    context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    context.maximum_version = version
    if ciphers is not None:
        context.set_ciphers(ciphers)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        return tls.version(), tls.cipher()[0]


def test_tls_1_2_is_offered_only_with_aead_suites(serve, pki):
    """grpcio's Python API cannot set a minimum TLS version (docs/security.md): TLS 1.2 is
    negotiable, but only with forward-secret AEAD suites; CBC and RSA key exchange fail."""
    running = serve()
    version, cipher = tls_handshake(running.port, pki, version=ssl.TLSVersion.TLSv1_2)
    assert version == "TLSv1.2"
    assert "GCM" in cipher or "CHACHA20" in cipher
    for legacy in ("ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384", "AES128-SHA"):
        with pytest.raises(ssl.SSLError):
            tls_handshake(running.port, pki, version=ssl.TLSVersion.TLSv1_2, ciphers=legacy)

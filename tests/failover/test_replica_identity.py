"""Agents accept any replica of the federation's coordinator identity and nothing else,
over real mTLS (docs/failover.md, "Certificates").

gRPC's Python client shows no peer certificate and takes no verify callback, so the agent
cannot read the server's SPIFFE URI itself. What it checks instead holds by construction:
the chain to the federation's CA, the host name, and the extended key usage serverAuth,
which the ``certs`` tool puts only on the coordinator role's certificates (BoringSSL
refuses a server certificate without it: "unsupported certificate purpose").
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from skyfed.agent.config import AgentConfig
from skyfed.agent.link import open_channel
from skyfed.certs.authority import CertificateAuthority
from skyfed.certs.cli import cli
from skyfed.certs.identity import Identity, IdentityError, identity_of_certificate
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.server import run_server


def reach(certs: Path, port: int) -> grpc.StatusCode:
    """What agent aws-1, dialling 127.0.0.1:``port`` as ``agent start`` does, gets back
    from a health check (OK: it accepted the server's certificate)."""
    config = AgentConfig(cloud="aws", certs=certs, coordinator=f"127.0.0.1:{port}")
    with open_channel(config) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def serving_as(pki: CertificateAuthority, name: str):  # noqa: ANN201
    """A coordinator on a free port that shows certificate ``name`` as its own."""
    d = pki.directory
    return run_server(
        CoordinatorConfig.from_flat(
            listen="127.0.0.1:0",
            ca=d / "ca.crt",
            crl=d / "crl.pem",
            cert=d / f"{name}.crt",
            key=d / f"{name}.key",
            probe_port=-1,
            eval_every=0,
        )
    )


@pytest.mark.parametrize("replica", ["a", "b"])
def test_agent_accepts_every_replica_with_its_own_key(pki: CertificateAuthority, replica: str):
    issued = pki.issue_coordinator(f"coordinator-{replica}", hosts=("127.0.0.1",))
    assert issued.identity.uri.endswith(f"/coordinator/coordinator-{replica}")
    with serving_as(pki, f"coordinator-{replica}") as running:
        assert reach(pki.directory, running.port) == grpc.StatusCode.OK


def test_replicas_hold_keys_of_their_own(pki: CertificateAuthority):
    a = pki.issue_coordinator("coordinator-a", hosts=("127.0.0.1",))
    b = pki.issue_coordinator("coordinator-b", hosts=("127.0.0.1",))
    assert a.key_path.read_bytes() != b.key_path.read_bytes()
    assert identity_of(a.cert_path) != identity_of(b.cert_path)


def identity_of(cert: Path) -> Identity:
    return identity_of_certificate(x509.load_pem_x509_certificate(cert.read_bytes()))


@pytest.mark.parametrize("impostor", ["gcp-1", "ops"])
def test_agent_refuses_a_server_whose_certificate_is_not_a_coordinators(
    pki: CertificateAuthority, impostor: str
):
    """An agent's (or an operator's) key, signed by the federation's own CA, cannot pose
    as the coordinator: its certificate has no serverAuth."""
    with serving_as(pki, impostor) as running:
        assert reach(pki.directory, running.port) == grpc.StatusCode.UNAVAILABLE


def test_agent_refuses_an_impostor_even_with_the_host_name(pki: CertificateAuthority):
    """A client-only certificate that names the dialled host is still refused."""
    pki._issue(  # the certs tool never makes this; a test forges it with the CA's key
        Identity.agent(pki.trust_domain, cloud="gcp", name="forged"),
        ["127.0.0.1"],
        [ExtendedKeyUsageOID.CLIENT_AUTH],
        pki._validity(30, None, None),
        False,
    )
    with serving_as(pki, "forged") as running:
        assert reach(pki.directory, running.port) == grpc.StatusCode.UNAVAILABLE


def test_only_the_coordinator_role_gets_server_auth(pki: CertificateAuthority):
    pki.issue_coordinator("coordinator-a", hosts=("127.0.0.1",))
    for item in pki.issued():
        cert = x509.load_pem_x509_certificate(item.cert_path.read_bytes())
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
        server = ExtendedKeyUsageOID.SERVER_AUTH in usages
        assert server == (item.identity.role == "coordinator"), item.identity.uri


def test_certs_issue_coordinator_takes_a_replica_name(pki: CertificateAuthority):
    args = ["issue", "coordinator", "--dir", str(pki.directory), "--replica", "b"]
    result = CliRunner().invoke(cli, [*args, "--host", "b.example", "--host", "10.0.0.2"])
    assert result.exit_code == 0, result.output
    assert "spiffe://skyfed.local/coordinator/coordinator-b" in result.output
    cert = x509.load_pem_x509_certificate((pki.directory / "coordinator-b.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["b.example"]
    both = CliRunner().invoke(cli, [*args, "--name", "x"])
    assert both.exit_code == 2 and "not both" in both.output


def test_replica_names_are_reserved_for_the_coordinator_role():
    with pytest.raises(IdentityError, match="reserved for the coordinator"):
        Identity.agent("skyfed.local", cloud="aws", name="coordinator-b")
    with pytest.raises(IdentityError, match="reserved for the coordinator"):
        Identity.admin("skyfed.local", name="coordinator-b")

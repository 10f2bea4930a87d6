"""SPIFFE identity rules: names, URIs, and reading identities out of certificates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from skyfed.certs.authority import CertificateAuthority
from skyfed.certs.identity import (
    NAME_PATTERN,
    Identity,
    IdentityError,
    identity_of_certificate,
)

names = st.from_regex(NAME_PATTERN, fullmatch=True)


def _self_signed(san: list[x509.GeneralName] | None) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
    )
    if san is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(key, hashes.SHA256())


def test_agent_uri_names_trust_domain_cloud_and_agent() -> None:
    identity = Identity(trust_domain="skyfed.local", role="agent", name="aws-1", cloud="aws")
    assert identity.uri == "spiffe://skyfed.local/cloud/aws/agent/aws-1"
    assert str(identity) == identity.uri


def test_coordinator_uri_has_no_cloud() -> None:
    identity = Identity.coordinator("skyfed.local")
    assert identity.uri == "spiffe://skyfed.local/coordinator/coordinator"


@settings(max_examples=50, deadline=None)
@given(cloud=names, name=names)
def test_identity_uri_round_trips(cloud: str, name: str) -> None:
    agent = Identity.agent("fed.example.com", cloud, name)
    coordinator = Identity.coordinator("fed.example.com", name)
    assert Identity.parse(agent.uri) == agent
    assert Identity.parse(coordinator.uri) == coordinator


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"name": "AWS-1"}, "name"),
        ({"name": "-x"}, "name"),
        ({"name": ""}, "name"),
        ({"name": "a" * 64}, "name"),
        ({"name": "a/b"}, "name"),
        ({"cloud": "a b"}, "cloud"),
        ({"cloud": None}, "cloud"),
        ({"trust_domain": "Skyfed.local"}, "trust_domain"),
        ({"trust_domain": "sky..fed"}, "trust_domain"),
        ({"trust_domain": "sky/fed"}, "trust_domain"),
        ({"role": "operator"}, "role"),
    ],
)
def test_invalid_field_raises_identity_error_naming_field_and_value(
    fields: dict[str, str | None], named: str
) -> None:
    values = {"trust_domain": "skyfed.local", "role": "agent", "name": "aws-1", "cloud": "aws"}
    values.update(fields)
    with pytest.raises(IdentityError, match=named) as err:
        Identity(**values)
    assert repr(fields[named]) in str(err.value)


def test_coordinator_with_a_cloud_is_refused() -> None:
    with pytest.raises(IdentityError, match="only agents have a cloud"):
        Identity(trust_domain="skyfed.local", role="coordinator", name="c", cloud="aws")


def test_identity_error_is_a_value_error() -> None:
    assert issubclass(IdentityError, ValueError)


@pytest.mark.parametrize(
    "uri",
    [
        "https://skyfed.local/coordinator/c",
        "SPIFFE://skyfed.local/coordinator/c",
        "spiffe://skyfed.local",
        "spiffe://skyfed.local/",
        "spiffe://skyfed.local/coordinator/c/",
        "spiffe://skyfed.local/coordinator/c?x=1",
        "spiffe://skyfed.local:443/coordinator/c",
        "spiffe://user@skyfed.local/coordinator/c",
        "spiffe://skyfed.local/cloud/aws/agent/",
        "spiffe://skyfed.local/cloud/aws/coordinator/c",
        "spiffe://skyfed.local/cloud/aws/agent/a/b",
        "spiffe://skyfed.local/cloud/aws/agent/../x",
        "",
    ],
)
def test_parse_refuses_anything_but_agent_or_coordinator_uris(uri: str) -> None:
    with pytest.raises(IdentityError):
        Identity.parse(uri)


def test_identity_of_certificate_reads_the_spiffe_uri(ca: CertificateAuthority) -> None:
    issued = ca.issue_agent("gcp", "gcp-7")
    assert identity_of_pem(issued.cert_path.read_bytes()) == Identity.agent(
        "skyfed.local", "gcp", "gcp-7"
    )


def test_coordinator_identity_ignores_dns_and_ip_names(ca: CertificateAuthority) -> None:
    issued = ca.issue_coordinator(hosts=["coord.example.com", "10.1.2.3"])
    assert identity_of_pem(issued.cert_path.read_bytes()) == Identity.coordinator("skyfed.local")


@pytest.mark.parametrize(
    "san",
    [
        None,
        [x509.DNSName("localhost")],
        [
            x509.UniformResourceIdentifier("spiffe://skyfed.local/coordinator/a"),
            x509.UniformResourceIdentifier("spiffe://skyfed.local/coordinator/b"),
        ],
    ],
    ids=["no-san", "no-uri", "two-uris"],
)
def test_certificate_without_exactly_one_spiffe_uri_is_refused(
    san: list[x509.GeneralName] | None,
) -> None:
    with pytest.raises(IdentityError, match="expected exactly one"):
        identity_of_certificate(_self_signed(san))


def identity_of_pem(pem: bytes) -> Identity:
    return identity_of_certificate(x509.load_pem_x509_certificate(pem))

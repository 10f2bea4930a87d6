"""The CA directory: init, open, issue, inventory, and how files are written."""

from __future__ import annotations

import ipaddress
import os
import shutil
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from skyfed.certs import files
from skyfed.certs.authority import AuthorityError, CertificateAuthority
from skyfed.certs.identity import Identity
from skyfed.certs.testing import make_federation


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _ext(cert: x509.Certificate, kind: type[x509.ExtensionType]) -> x509.ExtensionType:
    return cert.extensions.get_extension_for_class(kind).value


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_writes_a_p256_ca_that_may_sign_certificates_and_crls(
    ca: CertificateAuthority,
) -> None:
    cert = _load(ca.ca_cert_path)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"
    assert _ext(cert, x509.BasicConstraints) == x509.BasicConstraints(ca=True, path_length=0)
    usage = _ext(cert, x509.KeyUsage)
    assert usage.key_cert_sign and usage.crl_sign
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).critical


def test_init_writes_an_empty_crl_signed_by_the_ca(ca: CertificateAuthority) -> None:
    crl = x509.load_pem_x509_crl(ca.crl_path.read_bytes())
    assert len(crl) == 0
    assert crl.is_signature_valid(_load(ca.ca_cert_path).public_key())
    assert ca.revoked_serials() == frozenset()


def test_init_refuses_to_overwrite_an_existing_ca(ca: CertificateAuthority) -> None:
    with pytest.raises(FileExistsError, match="a CA already exists.*--force"):
        CertificateAuthority.init(ca.directory)


def test_init_with_force_replaces_the_ca(ca: CertificateAuthority) -> None:
    old_serial = _load(ca.ca_cert_path).serial_number
    CertificateAuthority.init(ca.directory, force=True)
    assert _load(ca.ca_cert_path).serial_number != old_serial


def test_open_reads_back_the_trust_domain(tmp_path: Path) -> None:
    CertificateAuthority.init(tmp_path, "fed.example.com")
    assert CertificateAuthority.open(tmp_path).trust_domain == "fed.example.com"


def test_open_of_an_uninitialised_directory_says_to_run_init(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="certs init"):
        CertificateAuthority.open(tmp_path / "nowhere")


def test_private_keys_are_written_0600(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old_umask = os.umask(0)  # the mode must come from os.open, not from a kind umask
    try:
        monkeypatch.setattr(os, "chmod", _forbidden_chmod)
        ca = make_federation(tmp_path)
    finally:
        os.umask(old_umask)
    keys = sorted(tmp_path.glob("*.key"))
    names = ["aws-1", "azure-1", "ca", "coordinator", "gcp-1", "ops"]
    assert [k.name for k in keys] == [f"{n}.key" for n in names]
    assert {_mode(k) for k in keys} == {0o600}
    assert _mode(ca.ca_cert_path) == 0o644


def _forbidden_chmod(*args: object, **kwargs: object) -> None:
    raise AssertionError("keys must be created with their mode, never chmod-ed after")


def test_private_key_temp_file_is_created_0600(
    ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def spy(path: str | Path, flags: int, mode: int = 0o777, **kw: object) -> int:
        opened.append((str(path), mode))
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", spy)
    ca.issue_agent("aws", "aws-1")
    key_temps = [mode for path, mode in opened if ".aws-1.key." in path]
    assert key_temps == [0o600]


def test_keys_are_unencrypted_pkcs8_pem(ca: CertificateAuthority) -> None:
    issued = ca.issue_agent("aws", "aws-1")
    pem = issued.key_path.read_bytes()
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    key = load_pem_private_key(pem, password=None)
    assert key.public_key() == _load(issued.cert_path).public_key()


def test_agent_certificate_has_only_its_uri_and_client_auth(ca: CertificateAuthority) -> None:
    issued = ca.issue_agent("aws", "aws-1")
    cert = _load(issued.cert_path)
    assert issued.identity == Identity.agent("skyfed.local", "aws", "aws-1")
    assert issued.serial == cert.serial_number
    assert list(_ext(cert, x509.SubjectAlternativeName)) == [
        x509.UniformResourceIdentifier("spiffe://skyfed.local/cloud/aws/agent/aws-1")
    ]
    assert list(_ext(cert, x509.ExtendedKeyUsage)) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "aws-1"
    assert _ext(cert, x509.BasicConstraints).ca is False
    cert.verify_directly_issued_by(_load(ca.ca_cert_path))


def test_coordinator_certificate_names_its_hosts_and_serves_and_dials(
    ca: CertificateAuthority,
) -> None:
    cert = _load(ca.issue_coordinator(hosts=["Coord.Example.com", "10.0.0.1", "::1"]).cert_path)
    san = _ext(cert, x509.SubjectAlternativeName)
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        "spiffe://skyfed.local/coordinator/coordinator"
    ]
    assert san.get_values_for_type(x509.DNSName) == ["coord.example.com"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert set(_ext(cert, x509.ExtendedKeyUsage)) == {
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.CLIENT_AUTH,
    }


def test_coordinator_certificate_passes_web_pki_server_verification(
    ca: CertificateAuthority,
) -> None:
    leaf = _load(ca.issue_coordinator().cert_path)
    store = verification.Store([_load(ca.ca_cert_path)])
    for host in (
        verification.DNSName("localhost"),
        verification.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ):
        verifier = verification.PolicyBuilder().store(store).build_server_verifier(host)
        verifier.verify(leaf, [])


def test_agent_certificate_passes_client_verification(ca: CertificateAuthority) -> None:
    leaf = _load(ca.issue_agent("azure", "azure-1").cert_path)
    store = verification.Store([_load(ca.ca_cert_path)])
    verified = verification.PolicyBuilder().store(store).build_client_verifier().verify(leaf, [])
    assert verified.subjects == [
        x509.UniformResourceIdentifier("spiffe://skyfed.local/cloud/azure/agent/azure-1")
    ]


def test_certificate_from_another_ca_fails_verification(
    ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    leaf = _load(other_ca.issue_agent("aws", "aws-1").cert_path)
    store = verification.Store([_load(ca.ca_cert_path)])
    with pytest.raises(verification.VerificationError):
        verification.PolicyBuilder().store(store).build_client_verifier().verify(leaf, [])


def test_expired_certificate_can_be_issued_for_tests(ca: CertificateAuthority) -> None:
    now = datetime.now(UTC)
    issued = ca.issue_agent(
        "aws", "old-1", not_before=now - timedelta(days=2), not_after=now - timedelta(days=1)
    )
    cert = _load(issued.cert_path)
    assert cert.not_valid_after_utc < now
    assert issued.not_after == cert.not_valid_after_utc
    store = verification.Store([_load(ca.ca_cert_path)])
    verifier = verification.PolicyBuilder().store(store).time(now).build_client_verifier()
    with pytest.raises(verification.VerificationError, match="not valid at validation time"):
        verifier.verify(cert, [])


def test_days_beyond_the_ca_lifetime_are_clamped_to_it(tmp_path: Path) -> None:
    ca = CertificateAuthority.init(tmp_path, days=10)
    issued = ca.issue_agent("aws", "aws-1", days=365)
    assert issued.not_after == _load(ca.ca_cert_path).not_valid_after_utc


def test_explicit_not_after_beyond_the_ca_is_refused(tmp_path: Path) -> None:
    ca = CertificateAuthority.init(tmp_path, days=10)
    with pytest.raises(AuthorityError, match="after the CA expires"):
        ca.issue_agent("aws", "aws-1", not_after=datetime.now(UTC) + timedelta(days=11))


def test_not_after_before_not_before_is_refused(ca: CertificateAuthority) -> None:
    now = datetime.now(UTC)
    with pytest.raises(AuthorityError, match="not after not_before"):
        ca.issue_agent("aws", "aws-1", not_before=now, not_after=now - timedelta(seconds=1))


def test_issuing_a_live_name_again_is_refused_unless_replaced(ca: CertificateAuthority) -> None:
    first = ca.issue_agent("aws", "aws-1")
    with pytest.raises(FileExistsError, match="already issued"):
        ca.issue_coordinator("aws-1")
    second = ca.issue_agent("aws", "aws-1", replace=True)
    assert second.serial != first.serial
    assert ca.get("aws-1").serial == second.serial


def test_a_revoked_name_can_be_issued_again(ca: CertificateAuthority) -> None:
    first = ca.issue_agent("aws", "aws-1")
    ca.revoke("aws-1")
    second = ca.issue_agent("aws", "aws-1")
    assert ca.revoked_serials() == {first.serial}
    assert not ca.is_revoked(second.serial)


def test_the_name_ca_is_reserved_for_the_ca(ca: CertificateAuthority) -> None:
    with pytest.raises(AuthorityError, match="reserved"):
        ca.issue_agent("aws", "ca")


@pytest.mark.parametrize("host", ["bad host", "", "a..b", "x/y"])
def test_a_host_that_is_neither_ip_nor_dns_is_refused(ca: CertificateAuthority, host: str) -> None:
    with pytest.raises(ValueError, match="invalid host"):
        ca.issue_coordinator(hosts=[host])


def test_issued_lists_what_this_ca_signed_and_skips_strangers(
    ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    ca.issue_coordinator()
    ca.issue_agent("gcp", "gcp-1")
    shutil.copy(other_ca.issue_agent("aws", "spy-1").cert_path, ca.directory / "spy-1.crt")
    (ca.directory / "junk.crt").write_bytes(b"not a certificate")
    issued = ca.issued()
    assert [i.identity.name for i in issued] == ["coordinator", "gcp-1"]
    assert issued[1].key_path == ca.directory / "gcp-1.key"


def test_make_federation_issues_a_coordinator_an_operator_and_three_agents(
    tmp_path: Path,
) -> None:
    ca = make_federation(tmp_path)
    assert [i.identity.uri for i in ca.issued()] == [
        "spiffe://skyfed.local/cloud/aws/agent/aws-1",
        "spiffe://skyfed.local/cloud/azure/agent/azure-1",
        "spiffe://skyfed.local/coordinator/coordinator",
        "spiffe://skyfed.local/cloud/gcp/agent/gcp-1",
        "spiffe://skyfed.local/admin/ops",
    ]


def test_a_failed_write_leaves_the_previous_file_and_no_temp_file(
    ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = ca.crl_path.read_bytes()

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        ca.refresh_crl()
    assert ca.crl_path.read_bytes() == before
    assert list(ca.directory.glob(".*.tmp")) == []

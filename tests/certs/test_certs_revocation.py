"""Revoking certificates, and the coordinator's live view of the CRL."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

from skyfed.certs import revocation
from skyfed.certs.authority import AuthorityError, CertificateAuthority
from skyfed.certs.revocation import RevocationError, RevocationList


def _crl(ca: CertificateAuthority) -> x509.CertificateRevocationList:
    return x509.load_pem_x509_crl(ca.crl_path.read_bytes())


def _crl_number(ca: CertificateAuthority) -> int:
    return _crl(ca).extensions.get_extension_for_class(x509.CRLNumber).value.crl_number


def test_revoke_by_name_lists_the_serial_and_increments_the_crl_number(
    ca: CertificateAuthority,
) -> None:
    issued = ca.issue_agent("aws", "aws-1")
    number = _crl_number(ca)
    assert ca.revoke("aws-1") == ca.crl_path
    assert [e.serial_number for e in _crl(ca)] == [issued.serial]
    assert _crl_number(ca) == number + 1
    assert ca.revoked_serials() == {issued.serial}


@pytest.mark.parametrize(
    "spell",
    [
        lambda i: i.serial,
        lambda i: str(i.serial),
        lambda i: f"0x{i.serial:x}",
        lambda i: f"{i.serial:X}".zfill(40)[:2] + ":" + f"{i.serial:X}".zfill(40)[2:],
        lambda i: str(i.cert_path),
    ],
    ids=["int", "decimal", "hex", "colon-hex", "cert-file"],
)
def test_revoke_accepts_a_serial_or_a_certificate_file(ca: CertificateAuthority, spell) -> None:
    issued = ca.issue_agent("aws", "aws-1")
    ca.revoke(spell(issued))
    assert ca.is_revoked(issued.serial)


def test_revoking_keeps_earlier_entries(ca: CertificateAuthority) -> None:
    first = ca.issue_agent("aws", "aws-1")
    second = ca.issue_agent("gcp", "gcp-1")
    ca.revoke("aws-1")
    ca.revoke("gcp-1")
    assert ca.revoked_serials() == {first.serial, second.serial}


def test_revoking_twice_leaves_one_entry(ca: CertificateAuthority) -> None:
    ca.issue_agent("aws", "aws-1")
    ca.revoke("aws-1")
    number = _crl_number(ca)
    ca.revoke("aws-1")
    assert len(_crl(ca)) == 1
    assert _crl_number(ca) == number


@pytest.mark.parametrize("what", ["aws-9", "cafe", "no/such/file.crt", "0", "0xzz"])
def test_revoking_an_unknown_name_is_a_clear_error(ca: CertificateAuthority, what: str) -> None:
    ca.issue_agent("aws", "aws-1")
    with pytest.raises(AuthorityError, match="nothing to revoke|invalid serial"):
        ca.revoke(what)
    assert ca.revoked_serials() == frozenset()


def test_revoking_a_certificate_of_another_ca_is_refused(
    ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    foreign = other_ca.issue_agent("aws", "aws-1")
    with pytest.raises(AuthorityError, match="not issued by this CA"):
        ca.revoke(str(foreign.cert_path))


def test_the_ca_cannot_revoke_itself(ca: CertificateAuthority) -> None:
    with pytest.raises(AuthorityError, match="CA's own certificate"):
        ca.revoke(str(ca.ca_cert_path))


def test_crl_is_signed_by_the_ca_and_due_for_update_in_the_future(
    ca: CertificateAuthority,
) -> None:
    ca.issue_agent("aws", "aws-1")
    ca.revoke("aws-1")
    crl = _crl(ca)
    assert crl.is_signature_valid(ca.certificate.public_key())
    assert crl.issuer == ca.certificate.subject
    assert crl.next_update_utc > datetime.now(UTC)


def test_revoked_serial_is_reported_after_crl_rewrite(ca: CertificateAuthority) -> None:
    issued = ca.issue_agent("aws", "aws-1")
    revoked = RevocationList(ca.crl_path, ca.ca_cert_path)
    assert not revoked.is_revoked(issued.serial)
    ca.revoke("aws-1")
    assert revoked.is_revoked(issued.serial)


def test_unchanged_crl_is_not_reloaded(
    ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    revoked = RevocationList(ca.crl_path, ca.ca_cert_path)
    loads: list[Path] = []
    real_load = revocation.load_crl
    monkeypatch.setattr(revocation, "load_crl", lambda *a: loads.append(a[0]) or real_load(*a))
    for _ in range(100):
        revoked.is_revoked(1)
    assert loads == []
    ca.refresh_crl()
    revoked.is_revoked(1)
    assert loads == [ca.crl_path]


def test_crl_signed_by_another_ca_is_rejected(
    ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    with pytest.raises(RevocationError, match="not signed by the CA"):
        RevocationList(other_ca.crl_path, ca.ca_cert_path)


def test_a_ca_whose_key_cannot_sign_is_refused_in_one_line(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    """A key-agreement key (X25519) in the CA's place can verify no CRL: say so, not crash."""
    signer = ed25519.Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "agreement-only")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(x25519.X25519PrivateKey.generate().public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .sign(signer, None)
    )
    with pytest.raises(RevocationError, match="has no signing key"):
        revocation.load_crl(ca.crl_path, cert)


def test_a_bad_crl_rewrite_keeps_the_previous_list_and_warns(
    ca: CertificateAuthority, other_ca: CertificateAuthority, caplog: pytest.LogCaptureFixture
) -> None:
    issued = ca.issue_agent("aws", "aws-1")
    ca.revoke("aws-1")
    revoked = RevocationList(ca.crl_path, ca.ca_cert_path)
    ca.crl_path.write_bytes(other_ca.crl_path.read_bytes())
    with caplog.at_level(logging.WARNING, logger="skyfed.certs.revocation"):
        assert revoked.is_revoked(issued.serial)
        ca.crl_path.write_bytes(b"garbage")
        assert revoked.is_revoked(issued.serial)
    assert len(caplog.records) == 2
    assert "keeping the previous CRL" in caplog.records[0].getMessage()


def test_a_missing_crl_is_an_error_at_first_load(ca: CertificateAuthority) -> None:
    ca.crl_path.unlink()
    with pytest.raises(RevocationError, match="cannot load CRL"):
        RevocationList(ca.crl_path, ca.ca_cert_path)


def test_lookups_from_many_threads_see_a_crl_being_rewritten(ca: CertificateAuthority) -> None:
    issued = [ca.issue_agent("aws", f"aws-{i}") for i in range(4)]
    revoked = RevocationList(ca.crl_path, ca.ca_cert_path)
    errors: list[BaseException] = []
    stop = threading.Event()

    def lookup() -> None:
        try:
            while not stop.is_set():
                revoked.revoked_serials()
        except BaseException as e:  # report any failure to the main thread
            errors.append(e)

    threads = [threading.Thread(target=lookup) for _ in range(4)]
    for t in threads:
        t.start()
    for item in issued:
        ca.revoke(item.identity.name)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert revoked.revoked_serials() == {i.serial for i in issued}

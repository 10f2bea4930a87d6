"""Plain-data descriptions of certificates and CRLs, for `certs show` and `certs list`."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from .identity import IdentityError, identity_of_certificate

Material = x509.Certificate | x509.CertificateRevocationList


def load_material(path: Path) -> Material:
    """A certificate or a CRL from a PEM or DER file; ValueError if it is neither."""
    data = Path(path).read_bytes()
    loaders = (
        x509.load_pem_x509_certificate,
        x509.load_pem_x509_crl,
        x509.load_der_x509_certificate,
        x509.load_der_x509_crl,
    )
    for loader in loaders:
        try:
            return loader(data)
        except ValueError:
            continue
    raise ValueError(f"{path} is neither a certificate nor a CRL (PEM or DER)")


def describe(material: Material) -> dict[str, object]:
    if isinstance(material, x509.Certificate):
        return describe_certificate(material)
    return describe_crl(material)


def format_serial(serial: int) -> str:
    return f"0x{serial:x}"


def format_time(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="seconds")


def _general_name(name: x509.GeneralName) -> str:
    prefix = {
        x509.UniformResourceIdentifier: "URI",
        x509.DNSName: "DNS",
        x509.IPAddress: "IP",
        x509.RFC822Name: "email",
    }.get(type(name), type(name).__name__)
    return f"{prefix}:{name.value}"


def _san(cert: x509.Certificate) -> list[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [_general_name(name) for name in ext.value]


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _spiffe_identity(cert: x509.Certificate) -> dict[str, object]:
    try:
        identity = identity_of_certificate(cert)
    except IdentityError as e:
        return {"spiffe_id": None, "identity_error": str(e)}
    return {"spiffe_id": identity.uri, "role": identity.role, "cloud": identity.cloud}


def describe_certificate(cert: x509.Certificate) -> dict[str, object]:
    not_after = cert.not_valid_after_utc
    return {
        "kind": "certificate",
        "subject": cert.subject.rfc4514_string(),
        **_spiffe_identity(cert),
        "serial": format_serial(cert.serial_number),
        "not_before": format_time(cert.not_valid_before_utc),
        "not_after": format_time(not_after),
        "expired": not_after < datetime.now(UTC),
        "san": _san(cert),
        "issuer": cert.issuer.rfc4514_string(),
        "is_ca": _is_ca(cert),
        "fingerprint_sha256": cert.fingerprint(hashes.SHA256()).hex(":").upper(),
    }


def describe_crl(crl: x509.CertificateRevocationList) -> dict[str, object]:
    try:
        number = crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    except x509.ExtensionNotFound:
        number = None
    revoked = [
        {"serial": format_serial(e.serial_number), "revoked_at": format_time(e.revocation_date_utc)}
        for e in crl
    ]
    return {
        "kind": "crl",
        "issuer": crl.issuer.rfc4514_string(),
        "crl_number": number,
        "last_update": format_time(crl.last_update_utc),
        "next_update": format_time(crl.next_update_utc),
        "revoked": revoked,
    }

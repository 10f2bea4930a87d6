"""What the federation's certificates and CRL contain: the X.509 profile, in one place."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .identity import SCHEME, Identity, is_dns_name

CLOCK_SKEW = timedelta(minutes=5)
"""Certificates start this long before now, so a peer with a slow clock accepts them."""
CRL_VALIDITY = timedelta(days=30)
"""The CRL's next_update: re-sign it (`certs refresh-crl`, or any revoke) before then."""


class HostError(ValueError):
    """A coordinator host that is neither an IP address nor a DNS name."""


def pem_private_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    """PKCS#8 PEM, unencrypted: the file's 0600 mode is its protection."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def pem_certificate(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def public_key_der(holder: ec.EllipticCurvePrivateKey | x509.Certificate) -> bytes:
    return holder.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def subject_alt_names(identity: Identity, hosts: Sequence[str] = ()) -> list[x509.GeneralName]:
    """The SPIFFE URI, then each host as an IP address if it parses as one, else a DNS name."""
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri)]
    for host in dict.fromkeys(h.strip() for h in hosts):
        names.append(_host_name(host))
    return names


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not is_dns_name(host.lower()):
        raise HostError(f"invalid host {host!r}: not an IP address or DNS name")
    return x509.DNSName(host.lower())


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def ca_certificate(
    key: ec.EllipticCurvePrivateKey, trust_domain: str, now: datetime, days: int
) -> x509.Certificate:
    """Self-signed, CA:true pathlen 0, keyCertSign + cRLSign, SAN = ``spiffe://<td>``."""
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "skyfed"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"skyfed CA {trust_domain}"),
        ]
    )
    trust_domain_uri = x509.UniformResourceIdentifier(f"{SCHEME}{trust_domain}")
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.SubjectAlternativeName([trust_domain_uri]), critical=False)
        .sign(key, hashes.SHA256())
    )


def leaf_certificate(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    identity: Identity,
    public_key: ec.EllipticCurvePublicKey,
    san: list[x509.GeneralName],
    usages: list[x509.ObjectIdentifier],
    validity: tuple[datetime, datetime],
) -> x509.Certificate:
    """CN = name, SAN = ``san`` (SPIFFE URI first), EKU = ``usages``, signed by the CA."""
    ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity.name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )


def revoked_entry(serial: int, when: datetime) -> x509.RevokedCertificate:
    return x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build()


def crl_entries(crl: x509.CertificateRevocationList | None) -> list[x509.RevokedCertificate]:
    """The entries of ``crl`` rebuilt for a new CRL (none when there is no CRL)."""
    if crl is None:
        return []
    return [revoked_entry(e.serial_number, e.revocation_date_utc) for e in crl]


def crl_number(crl: x509.CertificateRevocationList | None) -> int:
    if crl is None:
        return 0
    try:
        return crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    except x509.ExtensionNotFound:
        return 0


def signed_crl(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    revoked: list[x509.RevokedCertificate],
    number: int,
    now: datetime,
) -> x509.CertificateRevocationList:
    """A CRL numbered ``number``, valid from now for CRL_VALIDITY."""
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now)
        .next_update(now + CRL_VALIDITY)
        .add_extension(x509.CRLNumber(number), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    for entry in revoked:
        builder = builder.add_revoked_certificate(entry)
    return builder.sign(ca_key, hashes.SHA256())

"""The federation's certificate authority: one directory holding the CA, its CRL and leaves."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from skyfed.files import PUBLIC_MODE

from . import templates
from .files import DIRECTORY_MODE, directory_lock, write_atomic, write_private
from .identity import (
    NAME_PATTERN,
    Identity,
    IdentityError,
    identity_of_certificate,
    trust_domain_of_ca,
    validate_trust_domain,
)
from .revocation import load_crl

logger = logging.getLogger(__name__)

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CRL_FILE = "crl.pem"
RESERVED_NAMES = frozenset({"ca"})
"""Names an identity may not take because its files would collide with the CA's."""
_MAX_SERIAL = 2**159
_HEX_DIGITS = re.compile(r"[0-9a-fA-F]+")


class AuthorityError(ValueError):
    """A request the CA refuses: unknown name, foreign certificate, impossible validity."""


@dataclass(frozen=True)
class IssuedCertificate:
    """A leaf certificate in the CA's directory, and where its key lies."""

    identity: Identity
    cert_path: Path
    key_path: Path
    serial: int
    not_after: datetime


def _now() -> datetime:
    return datetime.now(UTC)


def _utc(moment: datetime) -> datetime:
    """Naive datetimes are taken as UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def parse_serial(text: str) -> int | None:
    """``0x1f`` or ``1F:2A`` (hex) or ``123`` (decimal) as an int; None otherwise.

    Bare hex such as ``cafe`` is refused: it reads like a name, and a typo must not revoke.
    """
    text = text.strip()
    if text.isdigit():
        return int(text)
    if text.lower().startswith("0x"):
        digits = text[2:]
    elif ":" in text:
        digits = text.replace(":", "")
    else:
        return None
    return int(digits, 16) if _HEX_DIGITS.fullmatch(digits) else None


class CertificateAuthority:
    """A federation's CA directory: ``ca.crt``, ``ca.key``, ``crl.pem``, ``<name>.crt/.key``.

    Open one with :meth:`init` (new CA) or :meth:`open` (existing). Every file is written
    atomically; private keys are created 0600.
    """

    def __init__(
        self, directory: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
    ) -> None:
        self._directory = Path(directory)
        self._cert = cert
        self._key = key
        self._trust_domain = self._trust_domain_of(cert)

    # -- construction ------------------------------------------------------------------

    @classmethod
    def init(
        cls,
        directory: Path,
        trust_domain: str = "skyfed.local",
        *,
        days: int = 3650,
        force: bool = False,
    ) -> CertificateAuthority:
        """Create a new CA (ECDSA P-256) and an empty CRL in ``directory``."""
        directory = Path(directory)
        validate_trust_domain(trust_domain)
        _check_days(days)
        existing = [n for n in (CA_CERT, CA_KEY) if (directory / n).exists()]
        if existing and not force:
            raise FileExistsError(
                f"a CA already exists in {directory} ({', '.join(existing)}); use --force "
                "(force=True) to replace it, which invalidates every certificate it issued"
            )
        directory.mkdir(parents=True, exist_ok=True, mode=DIRECTORY_MODE)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = templates.ca_certificate(key, trust_domain, _now(), days)
        with directory_lock(directory):
            write_private(directory / CA_KEY, templates.pem_private_key(key))
            write_atomic(directory / CA_CERT, templates.pem_certificate(cert), mode=PUBLIC_MODE)
            ca = cls(directory, cert, key)
            ca._write_crl([], number=1)
        logger.info("[Certs.Init] dir=%s trust_domain=%s", directory, trust_domain)
        return ca

    @classmethod
    def open(cls, directory: Path) -> CertificateAuthority:
        """Open the CA initialised in ``directory``."""
        directory = Path(directory)
        missing = [n for n in (CA_CERT, CA_KEY) if not (directory / n).is_file()]
        if missing:
            raise FileNotFoundError(
                f"no CA in {directory} (missing {', '.join(missing)}); "
                f"run `certs init --dir {directory}` first"
            )
        cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or (
            templates.public_key_der(key) != templates.public_key_der(cert)
        ):
            raise AuthorityError(f"{directory / CA_KEY} is not the key of {directory / CA_CERT}")
        return cls(directory, cert, key)

    @staticmethod
    def _trust_domain_of(cert: x509.Certificate) -> str:
        try:
            return trust_domain_of_ca(cert)
        except IdentityError as e:
            raise AuthorityError(str(e)) from None

    # -- properties --------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def trust_domain(self) -> str:
        return self._trust_domain

    @property
    def ca_cert_path(self) -> Path:
        return self._directory / CA_CERT

    @property
    def crl_path(self) -> Path:
        return self._directory / CRL_FILE

    @property
    def certificate(self) -> x509.Certificate:
        return self._cert

    # -- issuing -----------------------------------------------------------------------

    def issue_agent(
        self,
        cloud: str,
        name: str,
        *,
        days: int = 365,
        not_before: datetime | None = None,
        not_after: datetime | None = None,
        replace: bool = False,
    ) -> IssuedCertificate:
        """Issue an agent's client certificate (EKU clientAuth, SAN = its SPIFFE URI)."""
        identity = Identity.agent(self._trust_domain, cloud=cloud, name=name)
        return self._issue_client(identity, days, not_before, not_after, replace)

    def issue_admin(
        self,
        name: str,
        *,
        days: int = 365,
        not_before: datetime | None = None,
        not_after: datetime | None = None,
        replace: bool = False,
    ) -> IssuedCertificate:
        """Issue an operator's client certificate: admin calls (status, export) need one."""
        identity = Identity.admin(self._trust_domain, name=name)
        return self._issue_client(identity, days, not_before, not_after, replace)

    def _issue_client(
        self,
        identity: Identity,
        days: int,
        not_before: datetime | None,
        not_after: datetime | None,
        replace: bool,
    ) -> IssuedCertificate:
        validity = self._validity(days, not_before, not_after)
        return self._issue(identity, [], [ExtendedKeyUsageOID.CLIENT_AUTH], validity, replace)

    def issue_coordinator(
        self,
        name: str = "coordinator",
        hosts: Sequence[str] = ("localhost", "127.0.0.1"),
        *,
        days: int = 365,
        not_before: datetime | None = None,
        not_after: datetime | None = None,
        replace: bool = False,
    ) -> IssuedCertificate:
        """Issue the coordinator's certificate (serverAuth + clientAuth, SAN = URI + hosts)."""
        identity = Identity.coordinator(self._trust_domain, name=name)
        validity = self._validity(days, not_before, not_after)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        hosts = [hosts] if isinstance(hosts, str) else hosts
        return self._issue(identity, hosts, usages, validity, replace)

    def _issue(
        self,
        identity: Identity,
        hosts: Sequence[str],
        usages: list[x509.ObjectIdentifier],
        validity: tuple[datetime, datetime],
        replace: bool,
    ) -> IssuedCertificate:
        san = templates.subject_alt_names(identity, hosts)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = templates.leaf_certificate(
            self._cert, self._key, identity, key.public_key(), san, usages, validity
        )
        cert_path, key_path = self._paths(identity.name)
        with directory_lock(self._directory):
            self._check_name_free(identity.name, replace)
            write_private(key_path, templates.pem_private_key(key))
            write_atomic(cert_path, templates.pem_certificate(cert), mode=PUBLIC_MODE)
        logger.info(
            "[Certs.Issue] identity=%s serial=0x%x not_after=%s",
            identity.uri,
            cert.serial_number,
            cert.not_valid_after_utc.isoformat(),
        )
        return IssuedCertificate(
            identity, cert_path, key_path, cert.serial_number, cert.not_valid_after_utc
        )

    def _validity(
        self, days: int, not_before: datetime | None, not_after: datetime | None
    ) -> tuple[datetime, datetime]:
        """(start, end) of a leaf: explicit bounds win; ``days`` is clamped to the CA's life."""
        ca_end = self._cert.not_valid_after_utc
        start = _utc(not_before) if not_before is not None else _now() - templates.CLOCK_SKEW
        if not_after is not None:
            end = _utc(not_after)
            if end > ca_end:
                raise AuthorityError(f"not_after {end} is after the CA expires ({ca_end})")
        else:
            end = _now() + timedelta(days=_check_days(days))
            if end > ca_end:
                logger.warning("[Certs.Issue] clamping not_after %s to the CA's %s", end, ca_end)
                end = ca_end
        if end <= start:
            raise AuthorityError(f"not_after {end} is not after not_before {start}")
        return start, end

    def _paths(self, name: str) -> tuple[Path, Path]:
        return self._directory / f"{name}.crt", self._directory / f"{name}.key"

    def _check_name_free(self, name: str, replace: bool) -> None:
        if name in RESERVED_NAMES:
            raise AuthorityError(f"invalid name {name!r}: reserved for the CA's own files")
        cert_path = self._paths(name)[0]
        if replace or not cert_path.exists():
            return
        existing = self._load_issued(cert_path)
        if existing is None or existing.serial in self.revoked_serials():
            return
        raise FileExistsError(
            f"{name!r} is already issued ({existing.identity.uri}, serial "
            f"0x{existing.serial:x}); revoke it first, or use --replace (replace=True)"
        )

    # -- inventory ---------------------------------------------------------------------

    def issued(self) -> list[IssuedCertificate]:
        """Every leaf in the directory that this CA signed, sorted by name."""
        found = (self._load_issued(p) for p in sorted(self._directory.glob("*.crt")))
        return [item for item in found if item is not None]

    def get(self, name: str) -> IssuedCertificate:
        """The issued certificate called ``name``; AuthorityError if there is none."""
        if NAME_PATTERN.fullmatch(name) and name not in RESERVED_NAMES:
            item = self._load_issued(self._paths(name)[0])
            if item is not None:
                return item
        raise AuthorityError(f"no certificate named {name!r} was issued in {self._directory}")

    def _load_issued(self, cert_path: Path) -> IssuedCertificate | None:
        """The leaf in ``cert_path`` if this CA issued it; None (with a log line) otherwise."""
        if cert_path.name == CA_CERT or not cert_path.is_file():
            return None
        try:
            cert = self._verified_leaf(cert_path.read_bytes())
            identity = identity_of_certificate(cert)
        except (AuthorityError, IdentityError) as e:
            logger.warning("[Certs.Inventory] skipping %s: %s", cert_path, e)
            return None
        key_path = cert_path.with_suffix(".key")
        return IssuedCertificate(
            identity, cert_path, key_path, cert.serial_number, cert.not_valid_after_utc
        )

    def _verified_leaf(self, data: bytes) -> x509.Certificate:
        try:
            cert = x509.load_pem_x509_certificate(data)
        except ValueError as e:
            raise AuthorityError(f"not a PEM certificate: {e}") from None
        try:
            cert.verify_directly_issued_by(self._cert)
        except (ValueError, TypeError, InvalidSignature):
            raise AuthorityError("not issued by this CA") from None
        if cert.serial_number == self._cert.serial_number:
            raise AuthorityError("that is the CA's own certificate")
        return cert

    # -- revocation --------------------------------------------------------------------

    def revoked_serials(self) -> frozenset[int]:
        """Serials listed in this CA's CRL (empty if there is no CRL yet)."""
        crl = self._current_crl()
        return frozenset(e.serial_number for e in crl) if crl is not None else frozenset()

    def is_revoked(self, serial: int) -> bool:
        return serial in self.revoked_serials()

    def revoke(self, what: str | int) -> Path:
        """Add a certificate to the CRL: ``what`` is an issued name, a cert file or a serial."""
        serial = self.resolve_serial(what)
        with directory_lock(self._directory):
            crl = self._current_crl()
            revoked = templates.crl_entries(crl)
            if any(e.serial_number == serial for e in revoked):
                logger.info("[Certs.Revoke] serial=0x%x already revoked", serial)
                return self.crl_path
            revoked.append(templates.revoked_entry(serial, _now()))
            self._write_crl(revoked, number=templates.crl_number(crl) + 1)
        logger.info("[Certs.Revoke] serial=0x%x crl=%s", serial, self.crl_path)
        return self.crl_path

    def refresh_crl(self) -> Path:
        """Re-sign the CRL with the same entries and a fresh next_update."""
        with directory_lock(self._directory):
            crl = self._current_crl()
            self._write_crl(templates.crl_entries(crl), number=templates.crl_number(crl) + 1)
        return self.crl_path

    def resolve_serial(self, what: str | int) -> int:
        """The serial meant by an issued name, a certificate file, or a serial number."""
        if isinstance(what, int):
            return _check_serial(what)
        text = what.strip()
        if NAME_PATTERN.fullmatch(text) and (self._directory / f"{text}.crt").is_file():
            return self.get(text).serial
        if Path(text).is_file():
            try:
                return self._verified_leaf(Path(text).read_bytes()).serial_number
            except AuthorityError as e:
                raise AuthorityError(f"cannot revoke {text}: {e}") from None
        serial = parse_serial(text)
        if serial is None:
            raise AuthorityError(
                f"nothing to revoke called {text!r}: not an issued name in {self._directory}, "
                "a certificate file, or a serial number"
            )
        if serial not in {item.serial for item in self.issued()}:
            logger.warning("[Certs.Revoke] serial=0x%x is not among the issued files", serial)
        return _check_serial(serial)

    def _current_crl(self) -> x509.CertificateRevocationList | None:
        if not self.crl_path.exists():
            return None
        return load_crl(self.crl_path, self._cert)

    def _write_crl(self, revoked: list[x509.RevokedCertificate], number: int) -> None:
        crl = templates.signed_crl(self._cert, self._key, revoked, number, _now())
        write_atomic(self.crl_path, crl.public_bytes(serialization.Encoding.PEM), mode=PUBLIC_MODE)


def _check_serial(serial: int) -> int:
    if not 0 < serial < _MAX_SERIAL:
        raise AuthorityError(f"invalid serial {serial}: must be positive and at most 159 bits")
    return serial


def _check_days(days: int) -> int:
    if days < 1:
        raise AuthorityError(f"invalid days {days}: must be at least 1")
    return days

"""The coordinator's view of the CRL: verified against the CA, reloaded when the file changes."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

logger = logging.getLogger(__name__)


# DSA is not among them: cryptography deprecates it (a warning on import from 51 on), and
# no CA the ``certs`` tool makes, or any current one, signs with it.
_SIGNING_KEYS = (
    rsa.RSAPublicKey,
    ec.EllipticCurvePublicKey,
    ed25519.Ed25519PublicKey,
    ed448.Ed448PublicKey,
)


class RevocationError(ValueError):
    """A CRL that is missing, unreadable, or not signed by the federation's CA."""


def load_ca_certificate(ca_cert_path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(Path(ca_cert_path).read_bytes())
    except (OSError, ValueError) as e:
        raise RevocationError(f"cannot load CA certificate {ca_cert_path}: {e}") from None


def load_crl(crl_path: Path, ca_cert: x509.Certificate) -> x509.CertificateRevocationList:
    """Load a PEM CRL and check it was issued and signed by ``ca_cert``."""
    try:
        crl = x509.load_pem_x509_crl(Path(crl_path).read_bytes())
    except (OSError, ValueError) as e:
        raise RevocationError(f"cannot load CRL {crl_path}: {e}") from None
    public_key = ca_cert.public_key()
    # The kinds a CRL can be verified with, named rather than "all but key agreement":
    # each cryptography release widens public_key()'s union (50 added ML-KEM, which
    # cannot sign), and an exclusion list goes stale with it.
    if not isinstance(public_key, _SIGNING_KEYS):
        raise RevocationError(f"CA {ca_cert.subject.rfc4514_string()} has no signing key")
    if crl.issuer != ca_cert.subject or not crl.is_signature_valid(public_key):
        raise RevocationError(
            f"CRL {crl_path} is not signed by the CA {ca_cert.subject.rfc4514_string()}"
        )
    return crl


@dataclass(frozen=True, slots=True)
class _Snapshot:
    serials: frozenset[int]
    next_update: datetime | None


def file_version(*paths: Path) -> tuple[tuple[int, int, int, int], ...]:
    """What changes whenever a file is rewritten (atomically or in place); cheap to get."""
    versions = []
    for path in paths:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            versions.append((0, 0, 0, 0))
            continue
        versions.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(versions)


class RevocationList:
    """Answers "is this serial revoked?" from the federation's CRL, thread-safely.

    Each call stats the CRL (and CA) file; when either changed, the CRL is reloaded and
    verified against the CA. A CRL that fails to load or verify is logged and ignored:
    the last good list stays in force. The first load must succeed.
    """

    def __init__(self, crl_path: Path, ca_cert_path: Path) -> None:
        self._crl_path = Path(crl_path)
        self._ca_cert_path = Path(ca_cert_path)
        self._lock = threading.Lock()
        self._version = file_version(self._crl_path, self._ca_cert_path)
        self._snapshot = self._load()

    @property
    def crl_path(self) -> Path:
        return self._crl_path

    def is_revoked(self, serial: int) -> bool:
        return serial in self.revoked_serials()

    def revoked_serials(self) -> frozenset[int]:
        with self._lock:
            self._refresh_if_changed()
            return self._snapshot.serials

    def _refresh_if_changed(self) -> None:
        version = file_version(self._crl_path, self._ca_cert_path)
        if version == self._version:
            return
        self._version = version  # a bad file is reported once, not on every call
        try:
            self._snapshot = self._load()
        except RevocationError as e:
            logger.warning("[Certs.Revocation] keeping the previous CRL: %s", e)

    def _load(self) -> _Snapshot:
        crl = load_crl(self._crl_path, load_ca_certificate(self._ca_cert_path))
        serials = frozenset(entry.serial_number for entry in crl)
        next_update = crl.next_update_utc
        if next_update is not None and next_update < datetime.now(UTC):
            logger.warning(
                "[Certs.Revocation] CRL %s is past its next update (%s); "
                "re-sign it with `certs refresh-crl`",
                self._crl_path,
                next_update.isoformat(),
            )
        logger.info("[Certs.Revocation] loaded crl=%s revoked=%d", self._crl_path, len(serials))
        return _Snapshot(serials=serials, next_update=next_update)

"""mTLS for the coordinator: rotating server credentials, and who is on the other end.

gRPC's TLS stack checks that the client certificate chains to the federation CA and is
within its validity; it has no CRL option, does not enforce a sub-CA's path length and
knows nothing of trust domains, so each call is checked again here: the leaf must be
issued directly by the federation CA (the ``certs`` tool never makes sub-CAs), name the
CA's trust domain, and not be listed in a CRL that is re-read whenever the ``certs`` tool
rewrites it. Server and CA files are re-read on the next handshake after they change, so
rotation needs no restart.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from skyfed.certs.identity import (
    Identity,
    IdentityError,
    identity_of_certificate,
    trust_domain_of_ca,
)
from skyfed.certs.revocation import RevocationList, file_version, load_ca_certificate
from skyfed.errors import IdentityMismatchError, RevokedError

log = logging.getLogger(__name__)


class RotatingServerCredentials:
    """Server certificate, key and client CA, re-read when any of the files changes."""

    def __init__(self, cert: Path, key: Path, ca: Path) -> None:
        self.paths = (cert, key, ca)
        self._stamp = self._stamps()
        self._lock = threading.Lock()

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(), self._fetch, require_client_authentication=True
        )

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        cert, key, ca = (p.read_bytes() for p in self.paths)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC before each handshake: a new configuration only if files changed."""
        with self._lock:
            stamp = self._stamps()
            if stamp == self._stamp:
                return None
            try:
                config = self._configuration()
            except OSError as exc:
                log.warning("[Coordinator.TLS] keeping old credentials: %s", exc)
                return None
            self._stamp = stamp
            log.info("[Coordinator.TLS] reloaded server certificate and CA")
            return config

    def _stamps(self) -> tuple[tuple[int, int, int, int], ...]:
        return file_version(*self.paths)


# Roles that may make admin calls (Status, export): operators, and the coordinator's own
# certificate, whose holder has the server's key and so every power already.
ADMIN_ROLES = frozenset({"admin", "coordinator"})


class PeerAuthenticator:
    """Turns a call's verified client certificate into an :class:`Identity`, or refuses it."""

    def __init__(self, crl: Path | None, ca: Path) -> None:
        if crl is not None and not crl.exists():
            # `certs init` always writes one; a missing CRL must not silently allow revoked peers.
            raise FileNotFoundError(f"CRL {crl} does not exist (run `certs refresh-crl`)")
        if crl is None:
            log.warning("[Coordinator.TLS] no CRL configured: revoked certificates are accepted")
        self.revocations = RevocationList(crl, ca) if crl is not None else None
        self._ca = _ReloadingCertificate(ca)

    def identify(self, context: grpc.ServicerContext) -> Identity:
        return self.identify_with_serial(context)[0]

    def identify_with_serial(self, context: grpc.ServicerContext) -> tuple[Identity, int]:
        """The caller's identity and its certificate's serial (what revocation lists)."""
        pems = context.auth_context().get("x509_pem_cert")
        if not pems:
            raise RevokedError("no client certificate was presented")
        serial = x509.load_pem_x509_certificate(pems[0]).serial_number
        return self.identify_pem(pems[0]), serial

    def identify_pem(self, pem: bytes) -> Identity:
        """The identity of a client certificate gRPC has verified against the CA bundle."""
        cert = x509.load_pem_x509_certificate(pem)
        ca = self._ca.get()
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature) as exc:
            raise RevokedError(
                f"certificate serial {cert.serial_number:x} was not issued directly by the "
                "federation CA (intermediate CAs are not accepted)"
            ) from exc
        if self.revocations is not None and self.revocations.is_revoked(cert.serial_number):
            raise RevokedError(f"certificate serial {cert.serial_number:x} is revoked")
        try:
            identity = identity_of_certificate(cert)
            trust_domain = trust_domain_of_ca(ca)
        except IdentityError as exc:
            raise RevokedError(f"certificate carries no valid skyfed identity: {exc}") from exc
        if identity.trust_domain != trust_domain:
            raise RevokedError(
                f"certificate names trust domain {identity.trust_domain!r}; this federation "
                f"is {trust_domain!r}"
            )
        return identity

    def require_admin(self, context: grpc.ServicerContext) -> Identity:
        """The caller's identity if it may make admin calls; PERMISSION_DENIED otherwise."""
        identity = self.identify(context)
        if identity.role not in ADMIN_ROLES:
            raise IdentityMismatchError(
                f"{identity.uri} may not call this: admin calls need an operator certificate "
                "(`certs issue admin --name NAME`)"
            )
        return identity


class _ReloadingCertificate:
    """A PEM certificate file, re-read when its modification time or size changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._version = file_version(path)
        self._cert = load_ca_certificate(path)

    def get(self) -> x509.Certificate:
        with self._lock:
            version = file_version(self.path)
            if version != self._version:
                self._version = version
                self._cert = load_ca_certificate(self.path)
            return self._cert

"""mTLS for the coordinator: rotating server credentials, and who is on the other end.

gRPC's TLS stack checks that the client certificate chains to the federation CA and is
within its validity; it has no CRL option, so revocation is checked per call here, against
a CRL that is re-read whenever the ``certs`` tool rewrites it. Server and CA files are
re-read on the next handshake after they change, so rotation needs no restart.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import grpc
from cryptography import x509

from skyfed.certs.identity import Identity, IdentityError, identity_of_certificate
from skyfed.certs.revocation import RevocationList
from skyfed.errors import RevokedError

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

    def _stamps(self) -> tuple[tuple[int, int], ...]:
        out = []
        for p in self.paths:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)


class PeerAuthenticator:
    """Turns a call's verified client certificate into an :class:`Identity`, or refuses it."""

    def __init__(self, crl: Path | None, ca: Path) -> None:
        if crl is not None and not crl.exists():
            # `certs init` always writes one; a missing CRL must not silently allow revoked peers.
            raise FileNotFoundError(f"CRL {crl} does not exist (run `certs refresh-crl`)")
        if crl is None:
            log.warning("[Coordinator.TLS] no CRL configured: revoked certificates are accepted")
        self.revocations = RevocationList(crl, ca) if crl is not None else None

    def identify(self, context: grpc.ServicerContext) -> Identity:
        pems = context.auth_context().get("x509_pem_cert")
        if not pems:
            raise RevokedError("no client certificate was presented")
        cert = x509.load_pem_x509_certificate(pems[0])
        if self.revocations is not None and self.revocations.is_revoked(cert.serial_number):
            raise RevokedError(f"certificate serial {cert.serial_number:x} is revoked")
        try:
            return identity_of_certificate(cert)
        except IdentityError as exc:
            raise RevokedError(f"certificate carries no valid skyfed identity: {exc}") from exc

"""Ending a revoked identity's open streams within seconds of the CRL changing.

gRPC checks certificates at the handshake only, so a stream opened before ``certs
revoke`` would go on contributing. A watch thread re-reads the CRL every ``check_s``
seconds; each stream whose certificate serial is now listed has its contribution in
flight withdrawn and ends with UNAUTHENTICATED (docs/security.md, "Revocation").
"""

from __future__ import annotations

import logging
import threading

from skyfed.certs.revocation import RevocationList
from skyfed.coordinator.federation import Federation
from skyfed.coordinator.limits import StreamLimits

log = logging.getLogger(__name__)

CHECK_S = 1.0
"""How often the CRL file is looked at (a stat; it is parsed only when it changed)."""


class RevocationWatch:
    """A daemon thread ending the streams of revoked certificates."""

    def __init__(
        self,
        revocations: RevocationList,
        limits: StreamLimits,
        federation: Federation,
        check_s: float = CHECK_S,
    ) -> None:
        self.revocations = revocations
        self.limits = limits
        self.federation = federation
        self.check_s = check_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="revocation", daemon=True)

    def start(self) -> RevocationWatch:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def sweep(self) -> int:
        """End every open stream whose certificate is revoked; how many it ended."""
        revoked = self.revocations.revoked_serials()
        ended = 0
        for stream in self.limits.streams():
            if stream.serial in revoked and not stream.session.closed:
                reason = f"certificate serial {stream.serial:x} was revoked"
                log.warning("[Coordinator.Revoke] agent=%s %s", stream.session.key, reason)
                self.federation.admission.revoke(stream.session, reason)
                ended += 1
        return ended

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the watch must outlive one bad CRL read
                log.exception("[Coordinator.Revoke] sweep failed; retrying")

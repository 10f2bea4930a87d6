"""Ending a revoked identity's open calls within seconds of the CRL changing.

gRPC checks certificates at the handshake only, so a call opened before ``certs revoke``
would go on. A watch thread re-reads the CRL every ``check_s`` seconds; each open call
whose certificate serial is now listed ends: a session has its contribution in flight
withdrawn and ends with UNAUTHENTICATED, and so does a call still owing its first message
(an unjoined ``Stripe``); any other is ended by its servicer or cancelled
(docs/security.md, "Revocation").
"""

from __future__ import annotations

import logging
import threading

from skyfed.certs.revocation import RevocationList
from skyfed.coordinator.calls import CallGuard

log = logging.getLogger(__name__)

CHECK_S = 1.0
"""How often the CRL file is looked at (a stat; it is parsed only when it changed)."""


class RevocationWatch:
    """A daemon thread ending the calls of revoked certificates."""

    def __init__(
        self, revocations: RevocationList, calls: CallGuard, check_s: float = CHECK_S
    ) -> None:
        self.revocations = revocations
        self.calls = calls
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
        """End every open call whose certificate is revoked; how many it ended."""
        revoked = self.revocations.revoked_serials()
        ended = 0
        for call in self.calls.calls():
            if call.serial in revoked and not call.revoked:
                reason = f"certificate serial {call.serial:x} was revoked"
                log.warning(
                    "[Coordinator.Revoke] agent=%s method=%s %s",
                    call.identity.uri,
                    call.short_method,
                    reason,
                )
                call.revoke(reason)
                ended += 1
        return ended

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the watch must outlive one bad CRL read
                log.exception("[Coordinator.Revoke] sweep failed; retrying")

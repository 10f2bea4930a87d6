"""Which coordinator replica an agent dials next (docs/failover.md).

The agent knows every replica's HOST:PORT. It stays with the one it reached while its
sessions last; when a session ends it dials the next in turn, except when a standby named
the leader in its refusal: that address comes first. Only a replica whose certificate is
a coordinator's of the federation (serverAuth, issued by its CA) is ever trusted, so a
named address is dialled under the same check as any other.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class Replicas:
    """The addresses to dial, in turn; a named leader first."""

    def __init__(self, addresses: list[str]) -> None:
        if not addresses:
            raise ValueError("no coordinator address")
        self.addresses = addresses
        self._index = 0
        self._named: str | None = None

    @property
    def current(self) -> str:
        """The address the next session dials."""
        return self._named or self.addresses[self._index]

    def failed(self, leader: str = "") -> bool:
        """The session to ``current`` ended. ``leader``: the address its refusal named (a
        standby's), dialled next; else the next address in turn. True when the next dial
        follows a named leader (worth making at once)."""
        if leader and leader != self.current:
            if leader not in self.addresses:
                log.info("[Agent.Leader] a standby names %s, not among %s", leader, self.addresses)
            self._named = leader
            return True
        gone = self.current
        self._named = None
        self._index = (self._index + 1) % len(self.addresses)
        if self.addresses[self._index] == gone and len(self.addresses) > 1:
            # The named leader that did not answer is also next in turn: a partitioned
            # leader black-holes each dial for the connect timeout, so skip it this time.
            self._index = (self._index + 1) % len(self.addresses)
        return False

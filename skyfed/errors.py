"""Domain errors of the federation protocol. ``coordinator/service.py`` maps them to gRPC codes."""

from __future__ import annotations


class FederationError(Exception):
    """Base of every error a peer can cause; the message is meant for that peer's operator."""


class ProtocolError(FederationError):
    """A message that is malformed, out of order, duplicated or not expected now."""


class OversizedError(FederationError):
    """A chunk or payload larger than the negotiated bound."""


class ChecksumError(FederationError):
    """A chunk whose data does not match its checksum."""


class BadContributionError(FederationError):
    """A contribution with a wrong shape, non-finite values, an unknown codec or bad payload."""


class IdentityMismatchError(FederationError):
    """A hello whose claimed cloud or name disagrees with the certificate."""


class ModelMismatchError(FederationError):
    """A hello whose model fingerprint differs from the federation's."""


class UnsupportedExchangeError(FederationError):
    """The agent cannot contribute what the federation exchanges (an older agent)."""


class UnsupportedOuterError(FederationError):
    """An agent whose local phase the federation's outer step was measured to diverge with."""


class UnsupportedDigestError(FederationError):
    """A peer that names weights by another digest than this one (one from before v3)."""


class UnsupportedFrameError(FederationError):
    """A peer that speaks another payload frame version than this one."""


class RevokedError(FederationError):
    """A peer whose certificate is on the CRL or carries no valid identity."""


class LateContributionError(FederationError):
    """A contribution for a round that is already closed."""


class AlreadyContributedError(FederationError):
    """An earlier session of the same identity already contributed to this round."""


class NoSessionError(FederationError):
    """A stripe that names no live session of its identity (it ended or was replaced)."""


class TooManyStreamsError(FederationError):
    """An identity that already holds as many open streams as it may."""


class NotLeaderError(FederationError):
    """This coordinator replica is a standby (or was deposed): the agent should dial
    ``leader``, the HOST:PORT of the replica that leads ("" while none is known)."""

    def __init__(self, message: str, leader: str = "") -> None:
        super().__init__(message)
        self.leader = leader

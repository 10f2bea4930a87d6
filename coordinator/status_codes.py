"""The one place domain errors become gRPC status codes (stream aborts and in-band receipts)."""

from __future__ import annotations

from typing import NoReturn

import grpc

from skyfed.errors import (
    AlreadyContributedError,
    BadContributionError,
    ChecksumError,
    FederationError,
    IdentityMismatchError,
    LateContributionError,
    ModelMismatchError,
    NoSessionError,
    NotLeaderError,
    OversizedError,
    ProtocolError,
    RevokedError,
    TooManyStreamsError,
    UnsupportedDigestError,
    UnsupportedExchangeError,
    UnsupportedFrameError,
    UnsupportedOuterError,
)
from skyfed.proto.serde import LEADER_METADATA

# The one place domain errors become gRPC status codes.
STATUS_CODES: dict[type[FederationError], grpc.StatusCode] = {
    ProtocolError: grpc.StatusCode.INVALID_ARGUMENT,
    BadContributionError: grpc.StatusCode.INVALID_ARGUMENT,
    OversizedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ChecksumError: grpc.StatusCode.DATA_LOSS,
    IdentityMismatchError: grpc.StatusCode.PERMISSION_DENIED,
    ModelMismatchError: grpc.StatusCode.FAILED_PRECONDITION,
    UnsupportedExchangeError: grpc.StatusCode.FAILED_PRECONDITION,
    UnsupportedDigestError: grpc.StatusCode.FAILED_PRECONDITION,
    UnsupportedFrameError: grpc.StatusCode.FAILED_PRECONDITION,
    UnsupportedOuterError: grpc.StatusCode.FAILED_PRECONDITION,
    RevokedError: grpc.StatusCode.UNAUTHENTICATED,
    LateContributionError: grpc.StatusCode.ABORTED,
    AlreadyContributedError: grpc.StatusCode.ALREADY_EXISTS,
    NoSessionError: grpc.StatusCode.NOT_FOUND,
    TooManyStreamsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # A standby: the agent tries again, first at the leader the trailing metadata names.
    NotLeaderError: grpc.StatusCode.UNAVAILABLE,
}


def status_code(error: FederationError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]
    return grpc.StatusCode.INTERNAL


def abort(context: grpc.ServicerContext, error: FederationError) -> NoReturn:
    """End the call with ``error``'s code and message; a standby's refusal also carries
    the leader's HOST:PORT as trailing metadata (``serde.LEADER_METADATA``), which the
    agent dials next (docs/failover.md)."""
    if isinstance(error, NotLeaderError) and error.leader:
        context.set_trailing_metadata(((LEADER_METADATA, error.leader),))
    context.abort(status_code(error), str(error))
    raise AssertionError("ServicerContext.abort raises")  # its stubs do not say so

"""The one place domain errors become gRPC status codes (stream aborts and in-band receipts)."""

from __future__ import annotations

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
    OversizedError,
    ProtocolError,
    RevokedError,
    TooManyStreamsError,
    UnsupportedDigestError,
    UnsupportedExchangeError,
    UnsupportedFrameError,
    UnsupportedOuterError,
)

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
}


def status_code(error: FederationError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]
    return grpc.StatusCode.INTERNAL

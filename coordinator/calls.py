"""Every call to the coordinator, from the moment it opens: whose it is, how many one
identity holds, when its first message is due, and its end when its certificate is revoked.

gRPC serves at most ``MAX_SESSIONS`` calls at once and counts a call from the moment it
opens, before a servicer sees a byte of it. Checks inside the servicers alone let one
certificate hold every slot with calls that never send their first message (unjoined
``Stripe`` calls, or a ``Status`` whose request never comes). So a server interceptor
guards every method of the server, the health service's included: it identifies the
caller at once, counts the call against the identity's share, waits for the first message
no longer than a deadline, and keeps the call where the revocation watch finds it
(docs/security.md, "Call and stream limits").
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from skyfed.certs.identity import Identity
from skyfed.coordinator.limits import CallLimits
from skyfed.coordinator.security import PeerAuthenticator
from skyfed.coordinator.status_codes import status_code
from skyfed.errors import FederationError, TooManyStreamsError
from skyfed.logs import Throttle

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Call:
    """One open call: its method, its caller, and how it ends if the caller is revoked."""

    method: str
    identity: Identity
    serial: int
    """The serial of the certificate it authenticated with (what a CRL lists)."""
    context: grpc.ServicerContext
    first: Any = None
    """Its first message, once it came."""
    revoked: str = ""
    """Why its certificate's revocation ended it ("" while it has not)."""
    _outcome: str = "waiting"
    """waiting, arrived, ended (the caller ended it first), then serving (past the wait)."""
    _on_revoke: Callable[[str], None] | None = None
    _wake: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def short_method(self) -> str:
        return self.method.rsplit("/", 1)[-1]

    def ended_by(self, on_revoke: Callable[[str], None]) -> None:
        """How its servicer ends it on revocation (a session withdraws its contribution
        first); without one, a revoked call that is past its first message is cancelled."""
        with self._lock:
            self._on_revoke = on_revoke
            revoked = self.revoked
        if revoked:
            on_revoke(revoked)

    def revoke(self, reason: str) -> None:
        """End the call: one still owing its first message aborts with UNAUTHENTICATED;
        one being served is ended by its servicer, or cancelled."""
        with self._lock:
            if self.revoked:
                return
            self.revoked = reason
            waiting = self._outcome != "serving"
            on_revoke = self._on_revoke
        if waiting:
            self._wake.set()
        elif on_revoke is not None:
            on_revoke(reason)
        else:
            self.context.cancel()

    def wait_first(self, requests: Iterator[Any], timeout_s: float) -> str:
        """Read the first message (into :attr:`first`) on a thread of its own, waiting at
        most ``timeout_s``: ``arrived``, ``ended`` (the caller ended the call first) or
        ``late``. A revocation meanwhile ends the wait at once (:attr:`revoked` says so).
        Once the call is aborted, gRPC ends the thread's read."""
        reader = threading.Thread(
            target=self._read_first, args=(requests,), name="first-message", daemon=True
        )
        reader.start()
        self._wake.wait(timeout_s)
        with self._lock:
            outcome, self._outcome = self._outcome, "serving"
        return "late" if outcome == "waiting" else outcome

    def _read_first(self, requests: Iterator[Any]) -> None:
        try:
            self.first = next(requests)
            outcome = "arrived"
        except (StopIteration, grpc.RpcError):  # half-closed, cancelled, or aborted under us
            outcome = "ended"
        with self._lock:
            if self._outcome == "waiting":
                self._outcome = outcome
        self._wake.set()


class CallGuard(grpc.ServerInterceptor):
    """Wraps every handler of the server so that each call is identified, counted in
    ``limits`` and owes its first message within ``first_message_s`` seconds."""

    def __init__(
        self,
        auth: PeerAuthenticator,
        limits: CallLimits,
        first_message_s: float,
        refused: Callable[[str], None] = lambda code: None,
    ) -> None:
        self.auth = auth
        self.limits = limits
        self.first_message_s = first_message_s
        self._refused_metric = refused
        self._lock = threading.Lock()
        self._open: dict[int, Call] = {}
        """By ``id`` of the call's servicer context."""
        self._refusals = Throttle(interval_s=10.0)

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001, ANN201
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return _guarded(handler, self, handler_call_details.method)

    def of(self, context: grpc.ServicerContext) -> Call:
        """The call a servicer is serving (opened by this guard)."""
        with self._lock:
            return self._open[id(context)]

    def calls(self) -> list[Call]:
        """Every open call (a snapshot)."""
        with self._lock:
            return list(self._open.values())

    def open(self, method: str, context: grpc.ServicerContext) -> Call:
        """Identify and count a call that just opened; abort it if it may not be served."""
        try:
            identity, serial = self.auth.identify_with_serial(context)
            self.limits.admit(identity.uri, method)
        except FederationError as exc:
            code = status_code(exc)
            if not isinstance(exc, TooManyStreamsError) and self._refusals.ready(context.peer()):
                log.warning(
                    "[Coordinator.Calls] refused method=%s peer=%s: %s", method, context.peer(), exc
                )
            self._refused_metric(code.name)
            context.abort(code, str(exc))
            raise  # abort raised already
        call = Call(method, identity, serial, context)
        with self._lock:
            self._open[id(context)] = call
        return call

    def close(self, call: Call) -> None:
        with self._lock:
            if self._open.get(id(call.context)) is call:
                del self._open[id(call.context)]
        self.limits.release(call.identity.uri, call.method)

    def first_message(self, call: Call, requests: Iterator[Any]) -> None:
        """Wait for the call's first message (into ``call.first``), at most
        ``first_message_s``; abort the call if it does not come, if the caller ends the
        call first, or if its certificate is revoked meanwhile."""
        outcome = call.wait_first(requests, self.first_message_s)
        if call.revoked:
            call.context.abort(grpc.StatusCode.UNAUTHENTICATED, call.revoked)
        if outcome == "ended":
            call.context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the call ended before its first message"
            )
        if outcome == "late":
            log.warning(
                "[Coordinator.Calls] agent=%s method=%s peer=%s sent nothing within %.1f s",
                call.identity.uri,
                call.short_method,
                call.context.peer(),
                self.first_message_s,
            )
            call.context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no first message within hello_timeout_s={self.first_message_s} s of "
                "opening the call",
            )


def _guarded(
    handler: grpc.RpcMethodHandler, guard: CallGuard, method: str
) -> grpc.RpcMethodHandler:
    """``handler`` behind the guard, as a request-streaming handler: the guard reads the
    first message itself (a unary request too), so that it can stop waiting for it."""
    deserialize, serialize = handler.request_deserializer, handler.response_serializer
    if handler.response_streaming:
        inner = handler.stream_stream if handler.request_streaming else handler.unary_stream

        def stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            call = guard.open(method, context)
            try:
                guard.first_message(call, requests)
                if handler.request_streaming:
                    yield from inner(itertools.chain([call.first], requests), context)
                else:
                    yield from inner(call.first, context)
                if call.revoked:  # its servicer ended it on revocation
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, call.revoked)
            finally:
                guard.close(call)

        return grpc.stream_stream_rpc_method_handler(stream, deserialize, serialize)

    inner = handler.stream_unary if handler.request_streaming else handler.unary_unary

    def unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        call = guard.open(method, context)
        try:
            guard.first_message(call, requests)
            if handler.request_streaming:
                return inner(itertools.chain([call.first], requests), context)
            return inner(call.first, context)
        finally:
            guard.close(call)

    return grpc.stream_unary_rpc_method_handler(unary, deserialize, serialize)

"""The gRPC servicer: thin, translating messages into federation calls and errors into codes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import grpc

from skyfed.coordinator.federation import Federation
from skyfed.coordinator.limits import StreamLimits
from skyfed.coordinator.security import PeerAuthenticator
from skyfed.coordinator.session import Session
from skyfed.coordinator.status_codes import status_code
from skyfed.errors import FederationError, ProtocolError, RevokedError
from skyfed.logs import Throttle
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import federation_pb2_grpc as pb_grpc
from skyfed.proto import serde
from skyfed.wire import Announce, Chunk, Heartbeat, Hello

log = logging.getLogger(__name__)

REFUSAL_LOG_INTERVAL_S = 5.0
"""At most one refusal line per identity this often: garbage in a loop costs no log space."""


class FederationServicer(pb_grpc.FederationServicer):
    def __init__(
        self, federation: Federation, authenticator: PeerAuthenticator, limits: StreamLimits
    ) -> None:
        self.federation = federation
        self.auth = authenticator
        self.limits = limits
        self._refusals = Throttle(REFUSAL_LOG_INTERVAL_S)

    def Session(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext):  # noqa: N802, ANN201
        try:
            identity, serial = self.auth.identify_with_serial(context)
        except RevokedError as exc:
            log.warning("[Federation.Session] refused peer=%s: %s", context.peer(), exc)
            context.abort(status_code(exc), str(exc))
        session = Session(identity, context.peer())
        try:
            stream = self.limits.open(session, serial)
        except FederationError as exc:
            context.abort(status_code(exc), str(exc))
        log.info("[Federation.Session] agent=%s peer=%s", identity.uri, context.peer())
        context.add_callback(lambda: session.close(grpc.StatusCode.CANCELLED, "call ended"))
        reader = threading.Thread(
            target=self._read,
            args=(request_iterator, session),
            name=f"read-{identity.name}",
            daemon=True,
        )
        reader.start()
        try:
            yield from session.outbox  # heartbeats first, until the session is closed
        finally:
            self.limits.close(stream)
        self.federation.admission.leave(session)
        if session.abort_code not in (None, grpc.StatusCode.CANCELLED):
            context.abort(session.abort_code, session.abort_message)

    def _read(self, requests: Iterator[bytes], session: Session) -> None:
        fed = self.federation
        try:
            for data in requests:
                session.last_seen = time.monotonic()
                self._handle(session, serde.agent_message_from_bytes(data))
        except FederationError as exc:
            if self._refusals.ready(session.key):
                log.warning("[Federation.Session] agent=%s refused: %s", session.key, exc)
            fed.admission.leave(session)
            session.close(status_code(exc), str(exc))
            return
        except grpc.RpcError:
            pass  # the call ended under us (client gone, cancelled)
        except Exception as exc:  # a bug: this session ends, the coordinator serves on
            if self._refusals.ready(f"bug:{session.key}"):
                log.exception("[Federation.Session] agent=%s failed", session.key)
            fed.admission.leave(session)
            session.close(grpc.StatusCode.INTERNAL, f"the coordinator failed on a message: {exc!r}")
            return
        fed.admission.leave(session)
        session.close()

    def _handle(
        self, session: Session, message: Hello | Announce | Chunk | Heartbeat | None
    ) -> None:
        fed = self.federation
        if isinstance(message, Hello):
            fed.admission.join(session, message)
        elif isinstance(message, Announce):
            fed.intake.begin(session, message)
        elif isinstance(message, Chunk):
            fed.intake.chunk(session, message)
        elif isinstance(message, Heartbeat):
            fed.links.heartbeat(session, message)
            if message.sent_ns:  # an agent's echo of ours (sent_ns 0) gets no answer
                now_ns = time.monotonic_ns()
                fed.links.sent_heartbeat(session, now_ns)
                session.send(Heartbeat(sent_ns=now_ns, echo_ns=message.sent_ns))
        else:
            raise ProtocolError("an empty or unknown message")

    def Status(self, request: bytes, context: grpc.ServicerContext) -> pb.StatusReply:  # noqa: N802
        try:
            self.auth.require_admin(context)
            parsed = serde.parse(pb.StatusRequest, request)
        except FederationError as exc:
            context.abort(status_code(exc), str(exc))
        return serde.status_to_proto(self.federation.status(windows=parsed.windows))


def serve_federation(
    server: grpc.Server,
    federation: Federation,
    authenticator: PeerAuthenticator,
    limits: StreamLimits,
) -> None:
    """Add the ``Federation`` service for ``federation`` to ``server``.

    Requests reach the servicer as raw bytes (no deserializer): ``proto/serde.py`` parses
    them, so an unparseable message is INVALID_ARGUMENT with one log line, not gRPC's
    INTERNAL with a traceback per message.
    """
    servicer = FederationServicer(federation, authenticator, limits)
    handlers = {
        "Session": grpc.stream_stream_rpc_method_handler(
            servicer.Session,
            request_deserializer=None,
            response_serializer=pb.CoordinatorMessage.SerializeToString,
        ),
        "Status": grpc.unary_unary_rpc_method_handler(
            servicer.Status,
            request_deserializer=None,
            response_serializer=pb.StatusReply.SerializeToString,
        ),
    }
    service = pb.DESCRIPTOR.services_by_name["Federation"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))

"""The gRPC servicer: thin, translating messages into federation calls and errors into codes."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from typing import Protocol

import grpc

from skyfed.coordinator.calls import CallGuard
from skyfed.coordinator.federation import Federation
from skyfed.coordinator.limits import hello_due, stripes_allowed
from skyfed.coordinator.replicas.followers import serve_replicate
from skyfed.coordinator.security import PeerAuthenticator
from skyfed.coordinator.session import Session as AgentSession
from skyfed.coordinator.status_codes import abort, status_code
from skyfed.errors import FederationError, ProtocolError, TooManyStreamsError
from skyfed.logs import Throttle
from skyfed.netinfo import log_congestion_control, peer_host
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import federation_pb2_grpc as pb_grpc
from skyfed.proto import serde
from skyfed.proto.outbox import StripeLane
from skyfed.proto.stripes import Merge
from skyfed.status import ReplicaSet
from skyfed.wire import (
    AgentMessage,
    Announce,
    Chunk,
    ContributionEnd,
    Heartbeat,
    Hello,
    Leave,
)

log = logging.getLogger(__name__)

MERGE_SLACK_CHUNKS = 16
REFUSAL_LOG_INTERVAL_S = 5.0
"""At most one refusal line per identity this often: garbage in a loop costs no log space."""


class Leadership(Protocol):
    """A coordinator replica's standing (``coordinator/replicas``): the servicer admits
    sessions only while it leads."""

    def check(self) -> None:
        """Raise ``NotLeaderError`` (naming the leader) unless this replica leads now."""

    def replica_set(self) -> ReplicaSet:
        """The replicas as this one sees them, for Status."""

    @property
    def term(self) -> int:
        """The term this replica leads in (0 while it does not)."""


class FederationServicer(pb_grpc.FederationServicer):
    def __init__(
        self,
        federation: Federation,
        authenticator: PeerAuthenticator,
        calls: CallGuard,
        leadership: Leadership | None = None,
    ) -> None:
        self.federation = federation
        self.auth = authenticator
        self.calls = calls
        self.leadership = leadership
        """None: a single coordinator, which always leads."""
        self._refusals = Throttle(REFUSAL_LOG_INTERVAL_S)

    def Session(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext):  # noqa: N802, ANN201
        call = self.calls.of(context)  # identified and counted since it opened
        if self.leadership is not None:
            try:
                self.leadership.check()
            except FederationError as exc:
                abort(context, exc)
        # Headers at once: the agent learns its call reached a serving coordinator long
        # before the welcome, which waits for the lock a round's close holds (agent/link.py).
        context.send_initial_metadata(())
        session = AgentSession(call.identity, context.peer())
        hello_due(session, self.calls.first_message_s)
        call.ended_by(lambda reason: self.federation.admission.revoke(session, reason))
        session.merge = Merge(
            lambda m: self._handle(session, _ours(m)),
            max_held_bytes=self._max_held_bytes(),
        )
        log.info("[Federation.Session] agent=%s peer=%s", session.key, context.peer())
        session.cc = log_congestion_control(peer_host(context.peer()), "coordinator")
        context.add_callback(lambda: session.close(grpc.StatusCode.CANCELLED, "call ended"))
        reader = threading.Thread(
            target=self._read,
            args=(request_iterator, session),
            name=f"read-{session.identity.name}",
            daemon=True,
        )
        reader.start()
        yield from session.outbox  # heartbeats first, until the session is closed
        self.federation.admission.leave(session)
        if session.abort_code not in (None, grpc.StatusCode.CANCELLED):
            context.abort(session.abort_code, session.abort_message)

    def Stripe(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext):  # noqa: N802, ANN201
        """A further connection of a striped session: it joins with the welcome's token
        under the session's own identity, then carries chunks both ways. It counts as
        the session's, not as a stream of its own, against ``max_streams_per_identity``;
        a session holds at most :func:`stripes_allowed` of them. Until it joins it counts
        as a call of its identity (``coordinator/calls.py``)."""
        call = self.calls.of(context)
        identity = call.identity
        try:
            if self.leadership is not None:
                self.leadership.check()
            data = next(request_iterator, None)
            first = None if data is None else serde.parse(pb.AgentMessage, data)
            if first is None or first.WhichOneof("body") != "stripe_join":
                raise ProtocolError("a stripe's first message must join a session (StripeJoin)")
            with self.federation.cond:
                session = self.federation.admission.stripe(identity, first.stripe_join.token)
                allowed = stripes_allowed(session.max_streams)
                if session.stripes >= allowed:
                    raise TooManyStreamsError(
                        f"the session of {identity.uri} already holds {session.stripes} "
                        f"stripes, the most its max_streams={session.max_streams} allows"
                    )
                session.stripes += 1
        except FederationError as exc:
            log.warning("[Federation.Stripe] refused peer=%s: %s", context.peer(), exc)
            abort(context, exc)
        lane = session.outbox.stripe()
        log.info(
            "[Federation.Stripe] agent=%s peer=%s lane=%d", identity.uri, context.peer(), lane.index
        )
        context.add_callback(lane.end)
        call.ended_by(lambda reason: lane.end())  # the guard ends it UNAUTHENTICATED
        reader = threading.Thread(
            target=self._read_stripe,
            args=(request_iterator, session, lane),
            name=f"stripe-{identity.name}-{lane.index}",
            daemon=True,
        )
        reader.start()
        try:
            yield from lane  # until the agent closes it, it dies, or the session ends
        finally:
            lane.end()  # what it took and the agent did not acknowledge goes on the others
            with self.federation.cond:
                session.stripes -= 1

    def _max_held_bytes(self) -> int:
        """What a striped session may hold out of order: about one transfer of the model
        (a stalled connection holds back at most that), and some chunks of slack."""
        fed = self.federation
        return sum(fed.max_payload) + MERGE_SLACK_CHUNKS * fed.config.transport.max_chunk_bytes

    def _read(self, requests: Iterator[bytes], session: AgentSession) -> None:
        assert session.merge is not None
        try:
            for data in requests:
                session.last_seen = time.monotonic()
                # A chunk is read without protobuf, its data a view of what arrived
                # (serde.agent_chunk_from_bytes); anything else is parsed. Held out of
                # order, either weighs its bytes as received.
                fast = serde.agent_chunk_from_bytes(data)
                if fast is not None:
                    session.merge.add(*fast, len(data))
                    continue
                message = serde.parse(pb.AgentMessage, data)
                session.merge.add(message.order, message, len(data))
        except FederationError as exc:
            self._refused(session, exc)
            return
        except grpc.RpcError:
            pass  # the call ended under us (client gone, cancelled)
        except Exception as exc:  # noqa: BLE001 - a bug: this session ends, the coordinator serves on
            self._failed(session, exc)
            return
        self.federation.admission.leave(session)
        session.close()

    def _read_stripe(
        self, requests: Iterator[bytes], session: AgentSession, lane: StripeLane
    ) -> None:
        assert session.merge is not None
        try:
            for data in requests:
                fast = serde.agent_chunk_from_bytes(data)
                if fast is not None:
                    order, message = fast
                else:
                    message = serde.parse(pb.AgentMessage, data)
                    order = message.order if message.WhichOneof("body") == "chunk" else 0
                if not order:
                    raise ProtocolError("a stripe carries numbered chunks only")
                session.last_seen = time.monotonic()
                session.merge.add(order, message, len(data))
        except FederationError as exc:
            self._refused(session, exc)
        except grpc.RpcError:
            pass  # this connection ended; the session goes on over the others
        except Exception as exc:  # noqa: BLE001 - a bug: this session ends, the coordinator serves on
            self._failed(session, exc)
        finally:
            lane.end()

    def _failed(self, session: AgentSession, exc: Exception) -> None:
        """A bug met on one session's message: it ends with INTERNAL and one throttled
        traceback; the reader never dies silently."""
        if self._refusals.ready(f"bug:{session.key}"):
            log.exception("[Federation.Session] agent=%s failed", session.key)
        self.federation.admission.leave(session)
        session.close(grpc.StatusCode.INTERNAL, f"the coordinator failed on a message: {exc!r}")

    def _refused(self, session: AgentSession, exc: FederationError) -> None:
        if self._refusals.ready(session.key):  # one line per identity and interval
            log.warning("[Federation.Session] agent=%s refused: %s", session.key, exc)
        self.federation.refused(status_code(exc).name)
        self.federation.admission.leave(session)
        session.close(status_code(exc), str(exc))

    def _handle(self, session: AgentSession, message: AgentMessage | None) -> None:
        fed = self.federation
        if isinstance(message, Hello):
            fed.admission.join(session, message)
        elif isinstance(message, Announce):
            fed.intake.begin(session, message)
        elif isinstance(message, Chunk):
            fed.intake.chunk(session, message)
        elif isinstance(message, ContributionEnd):
            fed.intake.end(session, message)
        elif isinstance(message, Leave):
            fed.admission.left(session, message.reason)
        elif isinstance(message, Heartbeat):
            fed.links.heartbeat(session, message)
            session.outbox.acked(message.received)
            if message.sent_ns:  # an agent's echo of ours (sent_ns 0) gets no answer
                now_ns = time.monotonic_ns()
                fed.links.sent_heartbeat(session, now_ns)
                received = session.merge.received if session.merge is not None else 0
                session.send(Heartbeat(sent_ns=now_ns, echo_ns=message.sent_ns, received=received))
        else:
            raise ProtocolError("an empty or unknown message")

    def Status(self, request: bytes, context: grpc.ServicerContext) -> pb.StatusReply:  # noqa: N802
        try:
            self.auth.require_admin(context)
            parsed = serde.parse(pb.StatusRequest, request)
        except FederationError as exc:
            context.abort(status_code(exc), str(exc))
        status = self.federation.status(windows=parsed.windows)
        if self.leadership is not None:
            status = dataclasses.replace(status, replicas=self.leadership.replica_set())
        return serde.status_to_proto(status)

    def Replicate(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext):  # noqa: N802, ANN201
        """A standby replica follows this leader (``coordinator/replicas/followers.py``)."""
        call = self.calls.of(context)
        yield from serve_replicate(
            self.federation, call, self.leadership, request_iterator, context
        )


def serve_federation(
    server: grpc.Server,
    federation: Federation,
    authenticator: PeerAuthenticator,
    calls: CallGuard,
    leadership: Leadership | None = None,
) -> None:
    """Add the ``Federation`` service for ``federation`` to ``server``, whose interceptor
    ``calls`` identifies and counts every call before a servicer sees it (a replica's
    ``leadership`` admits sessions only while it leads).

    Requests reach the servicer as raw bytes (no deserializer): ``proto/serde.py`` parses
    them, so an unparseable message is INVALID_ARGUMENT with one log line, not gRPC's
    INTERNAL with a traceback per message.
    """
    servicer = FederationServicer(federation, authenticator, calls, leadership)
    handlers = {
        "Session": grpc.stream_stream_rpc_method_handler(
            servicer.Session,
            request_deserializer=None,
            response_serializer=serde.coordinator_message_bytes,
        ),
        "Stripe": grpc.stream_stream_rpc_method_handler(
            servicer.Stripe,
            request_deserializer=None,
            response_serializer=serde.coordinator_message_bytes,
        ),
        "Status": grpc.unary_unary_rpc_method_handler(
            servicer.Status,
            request_deserializer=None,
            response_serializer=pb.StatusReply.SerializeToString,
        ),
        "Replicate": grpc.stream_stream_rpc_method_handler(
            servicer.Replicate,
            request_deserializer=None,
            response_serializer=serde.leader_message_bytes,
        ),
    }
    service = pb.DESCRIPTOR.services_by_name["Federation"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))


def _ours(m: pb.AgentMessage | Chunk) -> AgentMessage | None:
    """What a session's merge delivers, as our message: a chunk the reader read without
    protobuf already is one (and was checked), anything else is converted and checked."""
    return m if isinstance(m, Chunk) else serde.agent_message_from_proto(m)

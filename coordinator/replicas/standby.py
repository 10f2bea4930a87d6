"""A standby replica's port: agents are told who leads, operators get the replicas' status.

It serves the same ``Federation`` service on the same port as the leader would, so an
agent that dials a standby learns the leader's HOST:PORT from the refusal
(UNAVAILABLE, trailing metadata ``skyfed-leader``: ``coordinator/status_codes.py``) and
dials it next (docs/failover.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from skyfed.coordinator.calls import CallGuard
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.limits import CallLimits, calls_allowed
from skyfed.coordinator.replicas.election import Elector
from skyfed.coordinator.replicas.followers import Followers
from skyfed.coordinator.replicas.record import Record
from skyfed.coordinator.replicas.replay import Replay
from skyfed.coordinator.security import PeerAuthenticator, RotatingServerCredentials
from skyfed.coordinator.server import ENVELOPE_BYTES
from skyfed.coordinator.status_codes import abort
from skyfed.errors import FederationError, NotLeaderError
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import serde
from skyfed.status import ReplicaInfo, ReplicaSet, Status

log = logging.getLogger(__name__)

WORKERS = 32
"""Calls a standby serves at once (its gRPC workers, less a few spare)."""


class Standing:
    """A replica's standing for the servicers: leads or not, who does, every replica and
    where each one's state stands."""

    def __init__(self, elector: Elector, record: Record | None = None) -> None:
        self.elector = elector
        self.record = record
        self.replay: Replay | None = None
        """This replica's replay of the leader's rounds, while it is a standby."""
        self.followers: Followers | None = None
        """The standbys following this replica, while it leads."""

    @property
    def term(self) -> int:
        """The term this replica leads in (0 while it does not)."""
        return self.elector.term or 0

    def check(self) -> None:
        """Raise NotLeaderError, naming the leader when known, unless this replica leads."""
        if self.elector.leading:
            return
        leader = self.elector.leader
        if leader is None or leader.replica == self.elector.replica:
            raise NotLeaderError(
                f"replica {self.elector.replica} is a standby; no leader known yet"
            )
        raise NotLeaderError(
            f"replica {self.elector.replica} is a standby; the leader is {leader.replica} at "
            f"{leader.address} (term {leader.term})",
            leader=leader.address,
        )

    def replica_set(self) -> ReplicaSet:
        leader = self.elector.leader
        leading = self.elector.leading
        members = [ReplicaInfo(r.name, r.address) for r in self.elector.replicas]
        followers, _replay = self.followers, self.replay
        released = self.record.released() if self.record is not None else None
        last = released.round if released is not None else -1
        alone = False
        if leading and followers is not None:
            members = followers.info(members)
            last, alone = followers.released, followers.alone
        members = [self._own(m, leading, last) for m in members]
        return ReplicaSet(
            replica=self.elector.replica,
            leading=leading,
            term=leader.term if leader else 0,
            leader=leader.replica if leader else "",
            leader_address=leader.address if leader else "",
            members=members,
            failovers=self.record.failovers() if self.record is not None else [],
            released=last,
            alone=alone,
        )

    def _own(self, member: ReplicaInfo, leading: bool, released: int) -> ReplicaInfo:
        """``member`` as this replica knows itself, when it is this replica."""
        if member.name != self.elector.replica:
            return member
        if leading:
            return dataclasses.replace(member, state="leader", round=released, lag=0)
        replay = self.replay
        if replay is None:
            return member
        lag = max(0, released - replay.held) if released >= 0 else 0
        return dataclasses.replace(member, state=replay.state, round=replay.held, lag=lag)


class StandbyServicer:
    """Session, Stripe and Replicate end at once with the leader's address; Status answers
    with the replicas and where this standby's own state stands (the round it would open
    next, its weights' digest), no agents."""

    def __init__(self, standing: Standing, auth: PeerAuthenticator) -> None:
        self.standing = standing
        self.auth = auth
        self.started = time.monotonic()

    def Session(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext):  # noqa: N802, ANN201
        self._refuse(context)
        yield from ()  # a stream handler; never reached

    def Stripe(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext):  # noqa: N802, ANN201
        self._refuse(context)
        yield from ()

    def Replicate(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext):  # noqa: N802, ANN201
        self._refuse(context)  # a standby's replay is pointed at the leader as agents are
        yield from ()

    def _refuse(self, context: grpc.ServicerContext) -> None:
        try:
            identity = self.auth.identify(context)
            self.standing.check()
        except FederationError as exc:
            log.debug("[Federation.Session] standby refused peer=%s: %s", context.peer(), exc)
            abort(context, exc)
        log.info("[Federation.Session] agent=%s: leading again, dial once more", identity.uri)
        elected = NotLeaderError("this replica was elected just now: dial it again")
        elected.leader = self.standing.elector.address
        abort(context, elected)

    def Status(self, request: bytes, context: grpc.ServicerContext) -> pb.StatusReply:  # noqa: N802
        try:
            self.auth.require_admin(context)
            serde.parse(pb.StatusRequest, request)
        except FederationError as exc:
            abort(context, exc)
        replay = self.standing.replay
        status = Status(
            round=replay.held + 1 if replay is not None else 0,
            agents=[],
            weights_digest=replay.model.weights_digest if replay is not None else "",
            uptime_s=time.monotonic() - self.started,
            rounds=[],
            finished=False,
            exchange="",
            replicas=self.standing.replica_set(),
        )
        return serde.status_to_proto(status)


@contextlib.contextmanager
def standby_server(config: CoordinatorConfig, listen: str, standing: Standing) -> Iterator[int]:
    """The standby's gRPC port on ``listen`` (mTLS, as the leader's), until the block
    exits; yields the bound port."""
    transport = config.transport
    assert transport.cert and transport.key and transport.ca  # checked by CoordinatorConfig
    creds = RotatingServerCredentials(transport.cert, transport.key, transport.ca).credentials()
    auth = PeerAuthenticator(transport.crl, transport.ca)
    # The leader's guard and bounds: every call identified and counted per identity, its
    # first message owed within hello_timeout_s, so one certificate's silent calls cannot
    # hold the standby's workers (and its answer naming the leader) from everyone else.
    per_identity = calls_allowed(
        transport.max_streams_per_identity, config.streams.max_streams, WORKERS
    )
    guard = CallGuard(
        auth,
        CallLimits(per_identity, sessions=transport.max_streams_per_identity),
        transport.hello_timeout_s,
    )
    limit = transport.max_chunk_bytes + ENVELOPE_BYTES
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=WORKERS + 4, thread_name_prefix="standby"),
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=WORKERS,
        interceptors=[guard],
    )
    servicer = StandbyServicer(standing, auth)
    handlers = {
        "Session": grpc.stream_stream_rpc_method_handler(
            servicer.Session, response_serializer=serde.coordinator_message_bytes
        ),
        "Stripe": grpc.stream_stream_rpc_method_handler(
            servicer.Stripe, response_serializer=serde.coordinator_message_bytes
        ),
        "Status": grpc.unary_unary_rpc_method_handler(
            servicer.Status, response_serializer=pb.StatusReply.SerializeToString
        ),
        "Replicate": grpc.stream_stream_rpc_method_handler(
            servicer.Replicate, response_serializer=serde.leader_message_bytes
        ),
    }
    service = pb.DESCRIPTOR.services_by_name["Federation"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    checks = health.HealthServicer()
    checks.set("", health_pb2.HealthCheckResponse.SERVING)  # the process is up...
    checks.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)  # ...and leads no round
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    port = server.add_secure_port(listen, creds)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    server.start()
    log.info("[Coordinator.Standby] replica=%s port=%d", standing.elector.replica, port)
    try:
        yield port
    finally:
        server.stop(grace=0).wait(timeout=5)

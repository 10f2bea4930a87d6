"""Every call is counted per identity from the moment it opens, owes its first message
within ``hello_timeout_s``, and ends when its certificate is revoked: one certificate
cannot lock the others out with calls that never speak (docs/security.md, "Call and
stream limits")."""

from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from skyfed.coordinator.admin import fetch_status
from skyfed.proto import federation_pb2 as pb
from tests.conftest import credentials
from tests.coordinator.test_bad_input import join

STRIPE = "/skyfed.v1.Federation/Stripe"
STATUS = "/skyfed.v1.Federation/Status"
CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"
SERVER_CALLS = 256
"""What the coordinator's gRPC server serves at once (coordinator/server.py)."""


class SilentCalls:
    """Calls of one method that open and send nothing (their request streams block)."""

    def __init__(self, channel: grpc.Channel, method: str) -> None:
        self._callable = channel.stream_stream(
            method, request_serializer=None, response_deserializer=None
        )
        self.calls: list[grpc.Call] = []
        self._queues: list[queue.Queue] = []

    def open(self, n: int, first: bytes | None = None) -> None:
        for _ in range(n):
            requests: queue.Queue = queue.Queue()
            if first is not None:
                requests.put(first)
            self._queues.append(requests)
            self.calls.append(self._callable(iter(requests.get, None)))

    def ended(self) -> list[grpc.Call]:
        return [c for c in self.calls if c.done()]

    def wait_ended(self, n: int, timeout_s: float) -> list[grpc.Call]:
        deadline = time.monotonic() + timeout_s
        while len(self.ended()) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.ended()

    def drained(self, timeout_s: float) -> list[grpc.Call]:
        """Those that ended, reading what they answered (a call that sent responses
        nobody read reports its end only when they are read)."""
        readers = [threading.Thread(target=_drain, args=(c,), daemon=True) for c in self.calls]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(timeout_s)
        return self.ended()

    def close(self) -> None:
        for requests in self._queues:
            requests.put(None)
        for call in self.calls:
            call.cancel()


def _drain(call: grpc.Call) -> None:
    try:
        for _ in call:
            pass
    except grpc.RpcError:
        pass


def test_unjoined_stripes_of_one_identity_leave_room_for_everyone_else(serve, raw_agent, pki):
    running = serve(hello_timeout_s=60, min_agents=2)
    address = f"localhost:{running.port}"
    with grpc.secure_channel(address, credentials(pki.directory, "aws-1")) as channel:
        hog = SilentCalls(channel, STRIPE)
        try:
            hog.open(SERVER_CALLS)  # never a StripeJoin
            refused = hog.wait_ended(SERVER_CALLS - SERVER_CALLS // 4, timeout_s=20)
            time.sleep(0.5)  # the rest stay held

            gcp = raw_agent(running.port, "gcp-1")  # another identity joins meanwhile
            assert join(gcp, "gcp", "gcp-1").round == 0
            status = fetch_status(address, pki.directory, "coordinator")
            assert [a.name for a in status.agents] == ["gcp-1"]

            held = [c for c in hog.calls if not c.done()]
            assert 1 <= len(held) <= SERVER_CALLS // 4, len(held)
            assert {c.code() for c in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            assert "calls_per_identity" in refused[0].details()

            pki.revoke("aws-1")  # ends the held calls too, before any joined
            ended = hog.wait_ended(SERVER_CALLS, timeout_s=8)
            assert len(ended) == SERVER_CALLS
            assert {c.code() for c in held} == {grpc.StatusCode.UNAUTHENTICATED}
            assert "revoked" in held[0].details()
        finally:
            hog.close()


@pytest.mark.parametrize("method", [STRIPE, STATUS, CHECK, WATCH])
def test_a_call_that_sends_no_first_message_ends_with_deadline_exceeded(serve, pki, method):
    running = serve(hello_timeout_s=0.5)
    name = "coordinator" if method == STATUS else "aws-1"
    with grpc.secure_channel(
        f"localhost:{running.port}", credentials(pki.directory, name)
    ) as channel:
        calls = SilentCalls(channel, method)
        try:
            calls.open(1)
            started = time.monotonic()
            (call,) = calls.wait_ended(1, timeout_s=8)
            assert time.monotonic() - started < 5
            assert call.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "hello_timeout_s=0.5" in call.details()
        finally:
            calls.close()


def test_a_revoked_identitys_calls_all_end(serve, raw_agent, pki):
    running = serve(hello_timeout_s=60)
    session = raw_agent(running.port, "aws-1")
    join(session, "aws", "aws-1")
    with grpc.secure_channel(
        f"localhost:{running.port}", credentials(pki.directory, "aws-1")
    ) as channel:
        stripes, watch = SilentCalls(channel, STRIPE), SilentCalls(channel, WATCH)
        try:
            stripes.open(3)
            watch.open(1, first=health_pb2.HealthCheckRequest().SerializeToString())
            time.sleep(0.5)
            assert not stripes.ended() and not watch.ended()

            pki.revoke("aws-1")
            revoked_at = time.monotonic()
            assert len(stripes.wait_ended(3, timeout_s=8)) == 3
            assert len(watch.drained(timeout_s=8)) == 1
            assert session.ended(timeout=8)[0] == grpc.StatusCode.UNAUTHENTICATED
            assert time.monotonic() - revoked_at < 5
            assert {c.code() for c in stripes.calls} == {grpc.StatusCode.UNAUTHENTICATED}
            assert watch.calls[0].code() == grpc.StatusCode.CANCELLED  # a call we do not own
        finally:
            stripes.close()
            watch.close()


def test_a_hello_after_a_heartbeat_is_still_due(serve, raw_agent):
    running = serve(hello_timeout_s=0.5)
    agent = raw_agent(running.port, "aws-1")
    agent.send(heartbeat=pb.Heartbeat())  # a first message, but no hello
    code, details = agent.ended(timeout=8)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "no hello" in details

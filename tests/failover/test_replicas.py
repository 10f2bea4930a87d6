"""`coordinator serve --replica` as real processes with a real etcd and real mTLS: one
leader, a killed leader replaced within the lease, a leader cut off from etcd that stops,
and agents given every replica's address that find the leader and follow it.

What the new leader's rounds start from (its own checkpoint directory, or fresh) is not
asserted here: a successor's state is the next part of docs/failover.md.
"""

from __future__ import annotations

import signal
import time

import grpc
import pytest
from click.testing import CliRunner

from skyfed.certs.authority import CertificateAuthority
from skyfed.coordinator.cli import main
from skyfed.coordinator.replicas.testing import EtcdServer, Relay
from skyfed.procs import Children, command
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import serde
from tests.conftest import credentials
from tests.coordinator.test_bad_input import hello
from tests.coordinator.test_call_limits import SilentCalls
from tests.failover import federation
from tests.failover.federation import NAMES, wait_for

pytestmark = pytest.mark.multiprocess

TTL_S = 2
SLACK_S = 4.0
"""Beyond the lease: etcd's expiry tick (0.5 s), the successor's start (its task, its
port) and a shared 2-core machine."""


class Replicas(federation.Replicas):
    """The replicas alone (one agent at most), at the election's defaults."""

    def start(self, name: str, etcd_url: str | None = None) -> None:
        flags = {
            "--replica": name,
            "--etcd": etcd_url or self.etcd_url,
            "--listen": f"127.0.0.1:{self.ports[name]}",
            "--certs": self.pki.directory,
            "--lease-ttl-s": TTL_S,
            "--min-agents": 1,
            "--codec": "fp16",
            "--probe-port": -1,
            "--eval-every": 0,
        }
        argv = command("coordinator", "serve", *(str(x) for kv in flags.items() for x in kv))
        self.kids.start(name, argv)


@pytest.fixture
def replicas(reaped: Children, pki: CertificateAuthority, etcd: EtcdServer) -> Replicas:
    """Three replicas; ``a`` is started first and leads before ``b`` and ``c`` start."""
    group = Replicas(reaped, pki, etcd.url)
    group.start("a")
    wait_for(lambda: group.leaders(("a",)), 90, "replica a to lead")
    group.start("b")
    group.start("c")
    wait_for(lambda: all(group.status(n) for n in ("b", "c")), 90, "the standbys")
    return group


def start_agent(kids: Children, pki: CertificateAuthority, addresses: list[str]) -> None:
    flags = {
        "--cloud": "aws",
        "--certs": pki.directory,
        "--coordinator": ",".join(addresses),
        "--local-steps": 1,
        "--reconnect-max-s": 0.5,
        "--no-progress": "",
    }
    args = [str(x) for kv in flags.items() for x in kv if x != ""]
    kids.start("aws", command("agent", "start", *args))


def agent_trains_with(group: Replicas, name: str, rounds: int) -> bool:
    s = group.status(name)
    if s is None or not s.replicas or not s.replicas.leading:
        return False
    connected = [a for a in s.agents if a.name == "aws-1" and a.state != "disconnected"]
    return bool(connected) and s.round >= rounds


def test_exactly_one_replica_leads_and_every_replica_names_it(replicas: Replicas):
    assert replicas.leaders() == [("a", replicas.leaders()[0][1])]
    for name in NAMES:
        s = replicas.status(name)
        assert s is not None and s.replicas is not None
        assert (s.replicas.leader, s.replicas.leader_address) == ("a", replicas.address("a"))

        def members(name: str = name) -> list[str]:
            s = replicas.status(name)
            return [m.name for m in s.replicas.members] if s and s.replicas else []

        wait_for(lambda m=members: m() == list(NAMES), 10, f"{name} to list every replica")
    # `coordinator status`, given a standby first, shows the replicas and the leader's rounds
    addresses = ",".join(replicas.address(n) for n in ("b", "a"))
    args = ["status", "--coordinator", addresses, "--certs", str(replicas.pki.directory)]
    shown = CliRunner().invoke(main, [*args, "--as", "ops"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "leader a (answered by a)" in text, text
    for name in NAMES:
        assert replicas.address(name) in text
    assert "round" in text


def test_a_standby_answers_a_session_with_the_leaders_address(replicas: Replicas):
    channel = grpc.secure_channel(
        replicas.address("b"), credentials(replicas.pki.directory, "aws-1")
    )
    with channel:
        call = serde.agent_stream(channel, "Session")(
            iter([pb.AgentMessage(hello=hello("aws", "aws-1"))])
        )
        with pytest.raises(grpc.RpcError) as refused:
            next(call)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (serde.LEADER_METADATA, replicas.address("a")) in refused.value.trailing_metadata()
    assert "the leader is a" in refused.value.details()
    # and Status, for an operator, with the replicas alone
    s = replicas.status("b")
    assert s is not None and s.replicas is not None and not s.replicas.leading
    assert s.agents == [] and s.rounds == []


def test_a_standby_bounds_each_identitys_calls_as_the_leader_does(replicas: Replicas):
    """A standby guards its calls as the leader does (``CallGuard``): counted per identity
    from the moment they open, each owing its first message, so one certificate's silent
    calls cannot take its workers; another agent is still told where the leader is."""
    address, certs = replicas.address("b"), replicas.pki.directory
    with grpc.secure_channel(address, credentials(certs, "coordinator-c")) as hog_channel:
        hog = SilentCalls(hog_channel, "/skyfed.v1.Federation/Replicate")
        try:
            hog.open(40)  # more than the standby serves at once
            refused = hog.wait_ended(30, timeout_s=10)  # past its share, at once
            assert {c.code() for c in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            with grpc.secure_channel(address, credentials(certs, "aws-1")) as channel:
                first = iter([pb.AgentMessage(hello=hello("aws", "aws-1"))])
                with pytest.raises(grpc.RpcError) as answered:
                    next(serde.agent_stream(channel, "Session")(first, timeout=10))
            assert answered.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "the leader is a" in answered.value.details()
        finally:
            hog.close()


def test_agents_find_the_leader_and_follow_it_after_a_kill(replicas: Replicas):
    """The agent is given the leader's address last: the standbys send it there. Then
    the leader dies (kill -9): a standby leads within the lease, with a higher term, and
    the agent trains with it."""
    start_agent(replicas.kids, replicas.pki, [replicas.address(n) for n in ("c", "b", "a")])
    wait_for(lambda: agent_trains_with(replicas, "a", 2), 180, "the agent to train with a")
    ((_, old_term),) = replicas.leaders()
    killed = time.monotonic()
    replicas.kids.procs["a"].send_signal(signal.SIGKILL)
    new = wait_for(lambda: replicas.leaders(("b", "c")), TTL_S + SLACK_S, "a new leader")
    took = time.monotonic() - killed
    ((leader, term),) = new
    assert term > old_term
    assert took <= TTL_S + SLACK_S
    wait_for(
        lambda: agent_trains_with(replicas, leader, 1), 120, f"the agent to train with {leader}"
    )
    log = (replicas.kids.log_dir / "aws.log").read_text()
    assert "[Agent.Leader]" in log


def test_a_leader_cut_off_from_etcd_stops_leading(
    reaped: Children, pki: CertificateAuthority, etcd: EtcdServer
):
    relay = Relay(etcd.client_port)
    try:
        group = Replicas(reaped, pki, etcd.url)
        group.start("a", etcd_url=relay.url)  # a reaches etcd only through the relay
        wait_for(lambda: group.leaders(("a",)), 90, "replica a to lead")
        group.start("b")
        wait_for(lambda: group.status("b"), 90, "the standby b")
        ((_, old_term),) = group.leaders(("a", "b"))
        relay.cut()
        cut = time.monotonic()
        wait_for(lambda: not group.leaders(("a",)), TTL_S + SLACK_S, "a to stop leading")
        assert time.monotonic() - cut <= TTL_S + SLACK_S
        ((leader, term),) = wait_for(lambda: group.leaders(("b",)), TTL_S + SLACK_S, "b to lead")
        assert (leader, term > old_term) == ("b", True)
        assert group.leaders(("a", "b")) == [("b", term)]
        # a lives on as a standby that names no one (it cannot reach etcd): it refuses sessions
        s = group.status("a")
        assert s is not None and s.replicas is not None and not s.replicas.leading
        assert reaped.procs["a"].poll() is None
    finally:
        relay.close()

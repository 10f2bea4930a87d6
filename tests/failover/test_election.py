"""Leadership through a real etcd: one leader, growing terms, a cut-off leader that stops
before anyone else can lead (coordinator/replicas/election.py)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from skyfed.certs.authority import CertificateAuthority
from skyfed.coordinator.replicas.election import Elector, guard_for
from skyfed.coordinator.replicas.etcd import Etcd, EtcdUnavailable, TlsFiles
from skyfed.coordinator.replicas.settings import parse_endpoints
from skyfed.coordinator.replicas.testing import EtcdServer, Relay, ServerTls

TTL_S = 2


@contextlib.contextmanager
def electors(urls: list[str], names: list[str], ttl_s: int = TTL_S) -> Iterator[list[Elector]]:
    """Replicas ``names`` campaigning through ``urls``; the first is started alone and
    leads before the others start."""
    started: list[Elector] = []
    try:
        for url, name in zip(urls, names, strict=True):
            elector = Elector(
                Etcd([url]), prefix="test", replica=name, address=f"{name}:7443", ttl_s=ttl_s
            )
            started.append(elector.start())
            if len(started) == 1:
                wait_for(lambda: started[0].leading, 10)
        yield started
    finally:
        for e in started:
            e.close()


def wait_for(predicate, timeout_s: float) -> float:  # noqa: ANN001
    """Seconds until ``predicate()`` held; fails the test past ``timeout_s``."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, "timed out"
        time.sleep(0.01)
    return time.monotonic() - start


def leaders(group: list[Elector]) -> list[Elector]:
    return [e for e in group if e.leading]


def test_exactly_one_of_three_replicas_leads(etcd: EtcdServer):
    with electors([etcd.url] * 3, ["a", "b", "c"]) as group:
        wait_for(lambda: len(leaders(group)) == 1, 10)
        for _ in range(20):  # and it stays one while the leases are refreshed
            assert len(leaders(group)) == 1
            time.sleep(0.1)
        (leader,) = leaders(group)
        # every replica names the same leader, with the term it leads in
        for e in group:
            wait_for(lambda e=e: e.leader is not None and e.leader.replica == leader.replica, 5)
            assert e.leader.term == leader.term
        wait_for(lambda: [r.name for r in group[0].replicas] == ["a", "b", "c"], 5)


def test_terms_increase_from_leader_to_leader(etcd: EtcdServer):
    terms = []
    with electors([etcd.url] * 3, ["a", "b", "c"]) as group:
        for _ in range(3):
            wait_for(lambda: len(leaders(group)) == 1, 10)
            (leader,) = leaders(group)
            terms.append(leader.term)
            leader.close()  # resigns: the next candidate takes over at once
            group.remove(leader)
            if not group:
                break
    assert terms == sorted(terms) and len(set(terms)) == 3, terms


def test_killed_leader_is_replaced_within_the_ttl(etcd: EtcdServer):
    """A leader that dies without resigning (its lease simply stops being refreshed):
    the next one leads once etcd expires the lease, within the TTL and etcd's 0.5 s tick."""
    relay = Relay(etcd.client_port)
    try:
        with electors([relay.url, etcd.url], ["a", "b"]) as (a, b):
            wait_for(lambda: a.leading, 10)
            wait_for(lambda: b.leader is not None and b.leader.replica == "a", 5)
            old_term = a.term
            killed = time.monotonic()
            relay.cut()  # as kill -9 would: no keep-alive, no resign
            wait_for(lambda: b.leading, TTL_S + 3)
            assert time.monotonic() - killed <= TTL_S + 1.5
            assert b.term > old_term
    finally:
        relay.close()


@pytest.mark.parametrize("ttl_s", [2, 4])
def test_cut_off_leader_stops_before_a_successor_leads(etcd: EtcdServer, ttl_s: int):
    """The safety of the election: a leader cut off from etcd stops acting on its own
    clock, at least the guard before etcd can expire its lease and elect another."""
    relay = Relay(etcd.client_port)
    stopped: list[float] = []
    try:
        with electors([relay.url, etcd.url], ["a", "b"], ttl_s=ttl_s) as (a, b):
            wait_for(lambda: a.leading, 10)
            old_term = a.term
            watcher = threading.Thread(
                target=lambda: (
                    wait_for(lambda: not a.leading, 3 * ttl_s),
                    stopped.append(time.monotonic()),
                ),
                daemon=True,
            )
            watcher.start()
            cut = time.monotonic()
            relay.cut()
            wait_for(lambda: b.leading, 3 * ttl_s)
            elected = time.monotonic()
            watcher.join()
            assert stopped, "the cut-off leader never stopped"
            assert stopped[0] - cut <= ttl_s  # deposed within the TTL
            # the guard apart, less what this test's polling thread may lag on a busy host
            assert elected - stopped[0] >= guard_for(ttl_s) / 2, (stopped[0] - cut, elected - cut)
            assert b.term > old_term
            assert not a.leading
    finally:
        relay.close()


def test_endpoints_are_checked():
    assert parse_endpoints("http://a:2379, https://b:2379") == ["http://a:2379", "https://b:2379"]
    for bad in ("", "a:2379", "http://a", "ftp://a:1"):
        with pytest.raises(ValueError, match="etcd endpoint|no etcd endpoint"):
            parse_endpoints(bad)


def test_replicas_reach_etcd_over_mutual_tls(tmp_path, pki):
    """etcd with its own CA's certificate, trusting only the federation's: a replica shows
    its own coordinator certificate; a client without one, or with another CA's, is
    refused."""
    etcd_ca = CertificateAuthority.init(tmp_path / "etcd-ca", "etcd.local")
    own = etcd_ca.issue_coordinator("etcd", hosts=("127.0.0.1", "localhost"))
    replica = pki.issue_coordinator("coordinator-a", hosts=("127.0.0.1",))
    # etcd's HTTP gateway dials etcd itself with etcd's own certificate: its CA is
    # trusted beside the federation's (docs/failover.md, "etcd over TLS").
    trusted = tmp_path / "etcd-clients.pem"
    trusted.write_bytes(pki.ca_cert_path.read_bytes() + etcd_ca.ca_cert_path.read_bytes())
    tls = ServerTls(own.cert_path, own.key_path, client_ca=trusted)
    server = EtcdServer(tmp_path / "etcd", tls=tls)
    try:
        mine = TlsFiles(etcd_ca.ca_cert_path, replica.cert_path, replica.key_path)
        elector = Elector(
            Etcd([server.url], tls=mine), prefix="t", replica="a", address="a:1", ttl_s=TTL_S
        ).start()
        try:
            wait_for(lambda: elector.leading, 10)
        finally:
            elector.close()
        other_ca = CertificateAuthority.init(tmp_path / "other-ca", "other.local")
        stranger = other_ca.issue_agent("x", "stranger")  # a certificate etcd does not trust
        for tls_files in (
            TlsFiles(etcd_ca.ca_cert_path, stranger.cert_path, stranger.key_path),
            TlsFiles(pki.ca_cert_path, replica.cert_path, replica.key_path),  # etcd unverified
        ):
            with pytest.raises(EtcdUnavailable):
                Etcd([server.url], tls=tls_files).grant(TTL_S)
    finally:
        server.stop()

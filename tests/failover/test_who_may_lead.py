"""Who may lead (docs/failover.md): a replica whose state does not hold the last released
round does not campaign, and steps down if elected; the release is written under the
leader's term alone; with no leader for two TTLs, a behind replica leads anyway. A real
etcd, the real elector and record (coordinator/replicas/record.py)."""

from __future__ import annotations

import time

from skyfed.coordinator.replicas.election import Elector
from skyfed.coordinator.replicas.etcd import Etcd
from skyfed.coordinator.replicas.record import NO_LEADER_TTLS, Record
from skyfed.coordinator.replicas.testing import EtcdServer
from tests.failover.test_election import TTL_S, wait_for


class Held:
    """A replica's state, as its replay says it: the last round it holds, and its digest."""

    def __init__(self, round_: int, digest: str) -> None:
        self.round, self.digest = round_, digest


def replica(etcd: EtcdServer, name: str, held: Held) -> tuple[Elector, Record]:
    client = Etcd([etcd.url])
    record = Record(client, "test", name)
    elector = Elector(client, prefix="test", replica=name, address=f"{name}:7443", ttl_s=TTL_S)
    elector.eligible = lambda fresh: record.eligible(held.round, held.digest, elector, fresh)
    return elector.start(), record


def test_only_a_replica_that_holds_the_released_round_takes_over(etcd: EtcdServer):
    a_held, b_held, c_held = Held(4, "w3:r4"), Held(3, "w3:r3"), Held(4, "w3:r4")
    a, a_record = replica(etcd, "a", a_held)
    try:
        wait_for(lambda: a.leading, 10)
        assert a_record.release(a, 4, "w3:r4")  # the leader released round 4
        b, _ = replica(etcd, "b", b_held)  # behind: round 3
        c, _ = replica(etcd, "c", c_held)  # holds round 4
        try:
            time.sleep(TTL_S)  # both are standing by, one campaigning
            a.close()  # the leader resigns: b's candidacy is older, yet c takes over
            wait_for(lambda: c.leading, 10)
            assert not b.leading
            b_held.round, b_held.digest = 4, "w3:r4"  # b catches up: a candidate again
            c.close()
            wait_for(lambda: b.leading, 10)
        finally:
            b.close()
            c.close()
    finally:
        a.close()


def test_a_deposed_leader_cannot_record_a_release(etcd: EtcdServer):
    a, record = replica(etcd, "a", Held(-1, ""))
    # a leads before b campaigns: each campaigns on a thread of its own, so b, started
    # right after, could otherwise create its key first and lead (the test then waited
    # for a in vain).
    wait_for(lambda: a.leading, 30)
    b, _ = replica(etcd, "b", Held(-1, ""))
    try:
        held = a.won
        assert held is not None
        a.close()  # deposed: its election key is gone
        wait_for(lambda: b.leading, 30)  # generous: what is pinned is the refusal
        assert not record.etcd.put_if(held, b"test/released", b"{}")
        assert not record.release(a, 0, "w3:stale")
    finally:
        b.close()


def test_with_no_leader_for_two_ttls_a_replica_behind_leads_anyway(etcd: EtcdServer):
    a, a_record = replica(etcd, "a", Held(6, "w3:r6"))
    wait_for(lambda: a.leading, 10)
    assert a_record.release(a, 6, "w3:r6")
    a.close()  # nobody left holds round 6
    b, _ = replica(etcd, "b", Held(2, "w3:r2"))
    try:
        took = wait_for(lambda: b.leading, 10 * TTL_S)
        assert took >= NO_LEADER_TTLS * TTL_S - 1  # it waited (its first read starts the clock)
    finally:
        b.close()

"""Leadership of the coordinator replicas, through etcd's election API.

Each replica holds an etcd lease (TTL ``ttl_s``, refreshed every third of it) and
campaigns with it (v3election Campaign); etcd makes the candidate whose key is oldest the
leader. The leader key's create revision is the leadership's **term**: etcd's revisions
only grow, and a successor's key is always younger than its predecessor's, so terms
strictly increase from one leader to the next.

A leader keeps its leadership only while its lease is proven alive. Every keep-alive
that succeeds was sent at a local time ``t``; etcd refreshed the lease after ``t``, so the
lease cannot expire before ``t + TTL``, and no other replica can be elected before it
expires. The leader stops acting at ``t + TTL - guard_s`` unless a later keep-alive
succeeded meanwhile: it has stopped ``guard_s`` before any successor can exist, whatever
etcd or the network does (docs/failover.md, "The timing"). A lease that was let go is
never refreshed again: the deposed replica revokes it if it can and campaigns anew with a
fresh one.

A replica campaigns only while ``eligible()`` says so: a standby whose state is behind the
last released round withdraws its candidacy until it has caught up (docs/failover.md,
"Who may lead"); one that wins while no longer eligible resigns at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from skyfed.coordinator.replicas.etcd import (
    Etcd,
    EtcdError,
    EtcdUnavailable,
    KeyValue,
    LeaderKey,
)

log = logging.getLogger(__name__)

RETRY_S = 0.5
"""Pause after a failed etcd call before the next try (grant, campaign, observe)."""
ELIGIBLE_POLL_S = 0.2
"""How often a replica that may not campaign yet looks again."""


@dataclass(frozen=True, slots=True)
class Leader:
    """Who leads, as etcd says: the replica, the address agents dial, the term."""

    replica: str
    address: str
    term: int


@dataclass(frozen=True, slots=True)
class Replica:
    """A replica that holds a live lease (registered under ``<prefix>/replicas/``)."""

    name: str
    address: str


def guard_for(ttl_s: float) -> float:
    """How long before its lease could expire a leader stops: a fifth of the TTL, at least
    half a second (room for the stop itself and for clocks that run at different rates)."""
    return max(0.5, ttl_s / 5)


class Elector:
    """This replica's candidacy. ``leading`` is true only inside a term this replica won
    and whose lease is proven alive; ``on_change`` is called (on an elector thread) when it
    is elected, when it is deposed and when the observed leader changes."""

    def __init__(
        self,
        etcd: Etcd,
        *,
        prefix: str,
        replica: str,
        address: str,
        ttl_s: int,
        on_change: Callable[[], None] | None = None,
        eligible: Callable[[bool], bool] | None = None,
    ) -> None:
        self.etcd = etcd
        self.replica = replica
        self.address = address
        self.ttl_s = ttl_s
        self.guard_s = guard_for(ttl_s)
        self._election = f"{prefix}/leader".encode()
        self._registry = f"{prefix}/replicas/".encode()
        self._on_change = on_change or (lambda: None)
        self.eligible: Callable[[bool], bool] = eligible or (lambda fresh: True)
        """``eligible(fresh)``: whether this replica may campaign now (``serve.py``: its
        state holds the last released round); ``fresh``: as etcd says at this moment."""
        self._cond = threading.Condition()
        self._closed = threading.Event()
        self._lease: int | None = None
        self._generation = 0  # a new lease, a new campaign: results of older ones are ignored
        self._valid_until = 0.0  # monotonic: the lease is proven alive until then, less guard
        self._won: LeaderKey | None = None
        self._observed: Leader | None = None
        self._other: Leader | None = None  # the last leader etcd named that was not us
        self._replicas: list[Replica] = []
        self._threads: list[threading.Thread] = []
        self._campaigning = False
        self.no_leader_since: float | None = None
        """Monotonic time since which etcd has named no leader (None: one leads, or not
        read yet)."""

    # ---- what the server reads ------------------------------------------------------------

    @property
    def leading(self) -> bool:
        with self._cond:
            return self._won is not None and time.monotonic() < self._valid_until

    @property
    def won(self) -> LeaderKey | None:
        """The leader key this replica holds while it leads: the proof a write is made
        under its term (``Etcd.put_if``)."""
        with self._cond:
            return self._won

    @property
    def term(self) -> int | None:
        """The term this replica leads in now; None when it does not lead."""
        with self._cond:
            return self._won.rev if self._won is not None else None

    @property
    def leader(self) -> Leader | None:
        """The leader as last observed (this replica itself while it leads)."""
        with self._cond:
            if self._won is not None:
                return Leader(self.replica, self.address, self._won.rev)
            return self._observed

    @property
    def previous(self) -> Leader | None:
        """The last other replica etcd named as leader (None: none seen): who this one
        took over from, once it leads."""
        with self._cond:
            return self._other

    @property
    def replicas(self) -> list[Replica]:
        """Every replica with a live lease, by name, as read with the last keep-alive that
        succeeded (a replica cut off from etcd answers at once, with what it last knew)."""
        with self._cond:
            return list(self._replicas)

    def _read_replicas(self) -> None:
        found = []
        with contextlib.suppress(EtcdUnavailable, EtcdError):
            for kv in self.etcd.get_prefix(self._registry):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    name = kv.key[len(self._registry) :].decode()
                    found.append(Replica(name, _address(kv.value)))
            with self._cond:
                self._replicas = sorted(found, key=lambda r: r.name)

    def wait_leading(self, stop: threading.Event, poll_s: float = 0.2) -> bool:
        """Block until this replica leads (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            with self._cond:
                if self._won is not None and time.monotonic() < self._valid_until:
                    return True
                self._cond.wait(poll_s)
        return False

    # ---- life ----------------------------------------------------------------------------

    def start(self) -> Elector:
        for target, name in (
            (self._keep, "lease"),
            (self._watch, "lease-guard"),
            (self._observe, "observe"),
        ):
            thread = threading.Thread(target=target, name=f"elector-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        """Resign if leading, end the lease (its keys go with it), stop every thread."""
        with self._cond:
            self._closed.set()
            won, lease = self._won, self._lease
            self._won, self._lease = None, None
            self._generation += 1
            self._cond.notify_all()
        with contextlib.suppress(EtcdUnavailable, EtcdError):
            if won is not None:
                self.etcd.resign(won)
                log.info("[Coordinator.Election] resigned term=%d", won.rev)
        with contextlib.suppress(EtcdUnavailable, EtcdError):
            if lease is not None:
                self.etcd.revoke(lease)
        for thread in self._threads:
            thread.join(timeout=2)

    # ---- the lease -----------------------------------------------------------------------

    def _keep(self) -> None:
        """Hold a lease: grant one, register, campaign with it, refresh it every TTL/3.
        A lease that lapsed (etcd says so, or it could not be refreshed in time) is let go
        and replaced."""
        while not self._closed.is_set():
            try:
                lease, generation = self._new_lease()
            except (EtcdUnavailable, EtcdError) as exc:
                log.warning("[Coordinator.Election] no lease: %s", exc)
                self._closed.wait(RETRY_S)
                continue
            self._refresh(lease, generation)

    def _new_lease(self) -> tuple[int, int]:
        sent = time.monotonic()
        lease, ttl = self.etcd.grant(self.ttl_s)
        self.etcd.put(self._registry + self.replica.encode(), _value(self.address), lease)
        with self._cond:
            self._generation += 1
            self._lease, generation = lease, self._generation
            self._confirm(sent, ttl)
        campaign = threading.Thread(
            target=self._campaign, args=(lease, generation), name="elector-campaign", daemon=True
        )
        campaign.start()
        self._read_replicas()
        log.info("[Coordinator.Election] replica=%s lease=%x campaigning", self.replica, lease)
        return lease, generation

    def _refresh(self, lease: int, generation: int) -> None:
        """Refresh ``lease`` until it lapses or is let go (generation moves on)."""
        while not self._closed.wait(self.ttl_s / 3):
            with self._cond:
                if generation != self._generation:
                    return  # deposed meanwhile: this lease is never refreshed again
            sent = time.monotonic()
            try:
                ttl = self.etcd.keepalive(lease)
            except (EtcdUnavailable, EtcdError) as exc:
                log.warning("[Coordinator.Election] keep-alive failed: %s", exc)
                continue  # the guard deposes us if this goes on
            with self._cond:
                if generation != self._generation:
                    return
                if ttl <= 0:
                    log.warning("[Coordinator.Election] lease %x expired at etcd", lease)
                    self._let_go("its lease expired at etcd")
                    return
                self._confirm(sent, ttl)
            self._read_replicas()
            self._read_leader()
            self._withdraw_if_behind()

    def _confirm(self, sent: float, ttl: int) -> None:
        """A keep-alive (or the grant) sent at ``sent`` succeeded; the caller holds the lock."""
        self._valid_until = max(self._valid_until, sent + min(ttl, self.ttl_s) - self.guard_s)

    def _watch(self) -> None:
        """Depose this replica the moment its lease is no longer proven alive. It sleeps
        until the deadline (or, while it does not lead, until it is elected)."""
        with self._cond:
            while not self._closed.is_set():
                if self._won is None:
                    self._cond.wait()
                    continue
                left = self._valid_until - time.monotonic()
                if left <= 0:
                    self._let_go("its lease could not be refreshed in time")
                    continue
                self._cond.wait(left)

    def _let_go(self, why: str) -> None:
        """Leave the lease behind (and leadership, if held); the caller holds the lock. The
        lease thread then grants a new one and campaigns again."""
        won, lease = self._won, self._lease
        self._won, self._lease = None, None
        self._generation += 1
        self._valid_until = 0.0
        self._cond.notify_all()
        if won is not None:
            log.warning("[Coordinator.Election] deposed term=%d: %s", won.rev, why)
            threading.Thread(target=self._on_change, name="elector-deposed", daemon=True).start()
        else:
            log.info("[Coordinator.Election] lease let go: %s", why)
        if lease is not None:
            threading.Thread(target=self._revoke, args=(lease,), daemon=True).start()

    def _revoke(self, lease: int) -> None:
        with contextlib.suppress(EtcdUnavailable, EtcdError):
            self.etcd.revoke(lease)

    # ---- the campaign --------------------------------------------------------------------

    def _campaign(self, lease: int, generation: int) -> None:
        """Campaign with ``lease`` until elected or the lease is let go; only while
        ``eligible()``."""
        while not self._closed.is_set():
            with self._cond:
                if generation != self._generation:
                    return
            if not self.eligible(False):
                self._closed.wait(ELIGIBLE_POLL_S)
                continue
            try:
                with self._cond:
                    self._campaigning = True
                won = self.etcd.campaign(self._election, lease, _value(self.address, self.replica))
                current = self.etcd.leader(self._election)
            except (EtcdUnavailable, EtcdError) as exc:
                log.warning("[Coordinator.Election] campaign: %s", exc)
                self._closed.wait(RETRY_S)
                continue
            finally:
                with self._cond:
                    self._campaigning = False
            self._elected(won, current, generation)
            return

    def _withdraw_if_behind(self) -> None:
        """A candidate that is no longer eligible lets its lease go (its candidacy goes
        with it) and campaigns again once it is."""
        with self._cond:
            if not self._campaigning or self._won is not None:
                return
        if self.eligible(False):
            return
        with self._cond:
            if self._campaigning and self._won is None:
                self._let_go("its state is behind the last released round: not a candidate")

    def _elected(self, won: LeaderKey, current: KeyValue | None, generation: int) -> None:
        with self._cond:
            if generation != self._generation:
                return  # this lease was let go while the campaign waited
            if time.monotonic() >= self._valid_until:
                self._let_go("elected on a lease no longer proven alive")
                return
            if current is None or current.key != won.key:
                self._let_go("etcd names another leader than the campaign won")
                return
        if not self.eligible(True):  # it fell behind while it waited in line
            with self._cond:
                if generation == self._generation:  # the lease's end takes the key back
                    self._let_go("elected while behind the last released round: steps down")
            return
        with self._cond:
            if generation != self._generation:
                return
            self._won = won
            self._cond.notify_all()
        log.info("[Coordinator.Election] elected replica=%s term=%d", self.replica, won.rev)
        self._on_change()

    # ---- observing -----------------------------------------------------------------------

    def _observe(self) -> None:
        """Follow who leads (Observe), for standbys to name the leader to agents."""
        while not self._closed.is_set():
            try:
                for kv in self.etcd.observe(self._election, self._closed):
                    self._observed_leader(kv)
            except EtcdUnavailable as exc:
                if not self._closed.is_set():
                    log.debug("[Coordinator.Election] observe: %s", exc)
            self._closed.wait(RETRY_S)

    def _read_leader(self) -> None:
        """Who leads, read outright: Observe may hang on a connection that a partition
        silently dropped, so each keep-alive that succeeds also asks."""
        try:
            kv = self.etcd.leader(self._election)
        except (EtcdUnavailable, EtcdError):
            return
        with self._cond:
            if kv is not None:
                self.no_leader_since = None
            elif self.no_leader_since is None:
                self.no_leader_since = time.monotonic()
        if kv is not None:
            self._observed_leader(kv)

    def _observed_leader(self, kv: KeyValue) -> None:
        try:
            data = json.loads(kv.value)
            leader = Leader(str(data["replica"]), str(data["address"]), kv.create_revision)
        except (ValueError, KeyError, TypeError):
            log.warning("[Coordinator.Election] a leader value that is not ours: %r", kv.value[:80])
            return
        with self._cond:
            changed = leader != self._observed
            self._observed = leader
            if leader.replica != self.replica:
                self._other = leader
        if changed:
            log.info(
                "[Coordinator.Election] leader=%s address=%s term=%d",
                leader.replica,
                leader.address,
                leader.term,
            )
            self._on_change()


def _value(address: str, replica: str | None = None) -> bytes:
    data = {"address": address} if replica is None else {"replica": replica, "address": address}
    return json.dumps(data).encode()


def _address(value: bytes) -> str:
    return str(json.loads(value)["address"])

"""The federation's small record in etcd, beside the election (docs/failover.md).

A few short keys under ``<etcd_prefix>/``, never round state:

- ``released``: the last round the leader released to the agents and its weights'
  digest, written before any agent gets the round's end, in a transaction that holds
  only while the writer's leader key is still the election's (its term): a deposed
  leader's write fails, so it releases nothing. It says who may lead next: a replica
  whose state does not hold that round withdraws its candidacy (:meth:`Record.eligible`).
- ``failovers/<term>``: every change of leader, as the new leader recorded it.
- ``resigned``: the term of a leader that stopped cleanly (a failover's cause).
- ``started``: when the federation's first leader started (a run's time axis).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from skyfed.coordinator.replicas.election import Elector
from skyfed.coordinator.replicas.etcd import Etcd, EtcdError, EtcdUnavailable
from skyfed.status import Failover

log = logging.getLogger(__name__)

CACHE_S = 0.5
"""How old a read of ``released`` or ``failovers/`` may be for status and the eligibility
poll (status never waits on etcd: a stale value is refreshed on a thread of its own)."""
RETRY_S = 0.1
NO_LEADER_TTLS = 2
"""With no leader for this many lease TTLs, a replica behind the last released round may
campaign anyway: the federation goes on from the freshest state left, and the failover
records the rounds lost."""


@dataclass(frozen=True, slots=True)
class Released:
    round: int
    digest: str
    term: int


class Record:
    """This federation's keys in ``etcd`` under ``prefix``."""

    def __init__(self, etcd: Etcd, prefix: str, replica: str) -> None:
        self.etcd = etcd
        self.replica = replica
        self._prefix = prefix.rstrip("/")
        self._lock = threading.Lock()
        self._released: tuple[float, Released | None] = (-CACHE_S, None)
        self._failovers: tuple[float, list[Failover]] = (-CACHE_S, [])
        self._refreshing: set[str] = set()
        self._warned_behind = False

    def _key(self, name: str) -> bytes:
        return f"{self._prefix}/{name}".encode()

    # ---- released ------------------------------------------------------------------------

    def release(self, elector: Elector, round_: int, digest: str) -> bool:
        """Record round ``round_`` as released under this leader's term; False once the
        term has ended (the caller then releases nothing). Retries etcd while it leads."""
        while elector.leading:
            won = elector.won
            if won is None:
                return False
            value = json.dumps(
                {"round": round_, "digest": digest, "term": won.rev, "replica": self.replica}
            ).encode()
            try:
                written = self.etcd.put_if(won, self._key("released"), value)
            except EtcdUnavailable as exc:
                log.warning("[Coordinator.Release] round=%d etcd: %s; retrying", round_, exc)
                time.sleep(RETRY_S)
                continue
            except EtcdError as exc:
                log.warning("[Coordinator.Release] round=%d refused by etcd: %s", round_, exc)
                return False
            if written:
                with self._lock:
                    self._released = (time.monotonic(), Released(round_, digest, won.rev))
            return written
        return False

    def released(self, fresh: bool = False) -> Released | None:
        """The last released round (None: none yet, or etcd not read yet). ``fresh``: as
        etcd says now (waits on etcd; the last value read if it cannot answer); else at
        most ``CACHE_S`` old where one was read, never waiting."""
        if fresh:
            return self._read_released()
        with self._lock:
            at, value = self._released
        if time.monotonic() - at >= CACHE_S:
            self._refresh("released", self._read_released)
        return value

    def _read_released(self) -> Released | None:
        with self._lock:
            value = self._released[1]
        try:
            kv = self.etcd.get(self._key("released"))
        except (EtcdUnavailable, EtcdError):
            return value
        if kv is not None:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                data = json.loads(kv.value)
                value = Released(int(data["round"]), str(data["digest"]), int(data["term"]))
        with self._lock:
            self._released = (time.monotonic(), value)
        return value

    def _refresh(self, name: str, read: Callable[[], object]) -> None:
        """``read()`` on a thread of its own unless one is already at it."""
        with self._lock:
            if name in self._refreshing:
                return
            self._refreshing.add(name)

        def run() -> None:
            try:
                read()
            finally:
                with self._lock:
                    self._refreshing.discard(name)

        threading.Thread(target=run, name=f"record-{name}", daemon=True).start()

    def eligible(self, held: int, digest: str, elector: Elector, fresh: bool = False) -> bool:
        """Whether a replica whose state holds round ``held`` (weights ``digest``) may
        campaign: it holds the last released round (or a later one it closed), or no
        replica has led for ``NO_LEADER_TTLS`` lease TTLs (then every standby is behind).
        ``fresh``: etcd read now (a replica just elected checks before it leads)."""
        last = self.released(fresh=True) if fresh else self._recent_released()
        if last is None or held > last.round or (held, digest) == (last.round, last.digest):
            self._warned_behind = False
            return True
        since = elector.no_leader_since
        if since is not None and time.monotonic() - since >= NO_LEADER_TTLS * elector.ttl_s:
            if not self._warned_behind:
                log.warning(
                    "[Coordinator.Election] no leader for %ds and this replica holds round %d, "
                    "behind the released round %d: it campaigns anyway",
                    NO_LEADER_TTLS * elector.ttl_s,
                    held,
                    last.round,
                )
                self._warned_behind = True
            return True
        return False

    def _recent_released(self) -> Released | None:
        """``released`` at most ``CACHE_S`` old: read now if the last read is older (the
        eligibility poll, on the election's threads)."""
        with self._lock:
            at, value = self._released
        return value if time.monotonic() - at < CACHE_S else self._read_released()

    # ---- failovers -----------------------------------------------------------------------

    def took_over(
        self, elector: Elector, lost_at: float | None, last_heard: float | None, held: int
    ) -> Failover | None:
        """Record that this replica now leads, holding round ``held``. The failover's
        duration counts from the first sign of the previous leader's loss this replica
        saw (``lost_at``: its stream ended; or etcd named no leader), else from the last
        message it heard from it (a frozen or partitioned leader goes silent). None: the
        federation's first leader, no failover."""
        term = elector.term or 0
        last = self.released(fresh=True)
        before = elector.previous
        if before is None and last is None:
            return None
        cause = "lease expired"
        with contextlib.suppress(EtcdUnavailable, EtcdError, ValueError, KeyError, TypeError):
            kv = self.etcd.get(self._key("resigned"))
            if (
                kv is not None
                and before is not None
                and json.loads(kv.value)["term"] == before.term
            ):
                cause = "resigned"
        now = time.monotonic()
        signs = [t for t in (lost_at, elector.no_leader_since) if t is not None]
        since = min(signs) if signs else last_heard
        failover = Failover(
            term=term,
            replica=self.replica,
            previous=before.replica if before is not None else "",
            cause=cause,
            duration_s=now - since if since is not None else 0.0,
            round=held + 1,
            lost_rounds=max(0, last.round - held) if last is not None else 0,
            at_unix_s=time.time(),
        )
        value = json.dumps(dataclasses.asdict(failover)).encode()
        with contextlib.suppress(EtcdUnavailable, EtcdError):
            self.etcd.put(self._key(f"failovers/{term:020d}"), value)
        with self._lock:
            self._failovers = (-CACHE_S, [])
        return failover

    def failovers(self) -> list[Failover]:
        """Every failover recorded, oldest first, as last read (never waits on etcd)."""
        with self._lock:
            at, value = self._failovers
        if time.monotonic() - at >= CACHE_S:
            self._refresh("failovers", self._read_failovers)
        return value

    def _read_failovers(self) -> None:
        found = []
        try:
            for kv in self.etcd.get_prefix(self._key("failovers/")):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    found.append(Failover(**json.loads(kv.value)))
        except (EtcdUnavailable, EtcdError):
            return
        with self._lock:
            self._failovers = (time.monotonic(), sorted(found, key=lambda f: f.term))

    def resigning(self, term: int) -> None:
        """This leader stops cleanly: its successor's failover says so."""
        value = json.dumps({"term": term, "replica": self.replica}).encode()
        with contextlib.suppress(EtcdUnavailable, EtcdError):
            self.etcd.put(self._key("resigned"), value)

    # ---- the run's start -----------------------------------------------------------------

    def started_unix_s(self) -> float:
        """When the federation's first leader started (written by it), seconds since the
        epoch: every leader's wall time counts from it. Now, if etcd cannot say."""
        now = time.time()
        with contextlib.suppress(EtcdUnavailable, EtcdError, ValueError, KeyError, TypeError):
            self.etcd.put_if_absent(self._key("started"), json.dumps({"unix_s": now}).encode())
            kv = self.etcd.get(self._key("started"))
            if kv is not None:
                return float(json.loads(kv.value)["unix_s"])
        return now

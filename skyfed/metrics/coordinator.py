"""The coordinator's exporter: reads the status snapshot at scrape time, so the round engine
itself makes no metric calls.

The snapshot is the status as plain data (``skyfed.coordinator.snapshot``: the fields of
``skyfed/status.py`` by name) plus ``task``; an agent entry carries its session's
``streams`` and, once its agent timed an exchange, its latest ``efficiency`` (exchange
against the link's floor, docs/striping.md). A missing field leaves its metric without
samples.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from skyfed.compression import codec_names
from skyfed.metrics.catalog import COORDINATOR, ROUND_BUCKETS_S
from skyfed.metrics.families import Families, Monotone

Snapshot = Mapping[str, Any]
STATES = ("syncing", "training", "sending", "idle", "disconnected")
VERSION = "0.1.0"


class RoundTally:
    """Rounds seen so far (status keeps only the last ones): counts, sums, the histogram."""

    def __init__(self) -> None:
        self.last_round = -1
        self.count = 0
        self.duration_s = self.train_s = self.exchange_s = 0.0
        self.bytes: dict[tuple[str, str], float] = {}
        self.buckets = [0] * len(ROUND_BUCKETS_S)

    def add(self, rounds: list[Mapping[str, Any]]) -> None:
        for r in rounds:
            if int(r["round"]) <= self.last_round:
                continue
            self.last_round = int(r["round"])
            duration, train = float(r["duration_s"]), float(r["train_s"])
            self.count += 1
            self.duration_s += duration
            self.train_s += train
            self.exchange_s += max(0.0, duration - train)
            for i, bound in enumerate(ROUND_BUCKETS_S):
                self.buckets[i] += duration <= bound
            for direction in ("up", "down"):
                for kind, key in (
                    ("wire", f"bytes_{direction}"),
                    ("raw", f"raw_bytes_{direction}"),
                ):
                    slot = (direction, kind)
                    self.bytes[slot] = self.bytes.get(slot, 0.0) + float(r.get(key, 0))

    def histogram(self) -> list[tuple[str, float]]:
        return [
            *(
                (floatToGoString(b), float(n))
                for b, n in zip(ROUND_BUCKETS_S, self.buckets, strict=True)
            ),
            ("+Inf", float(self.count)),
        ]


class CoordinatorCollector(Collector):
    """A prometheus-client collector over ``snapshot()``; register it in a registry."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot
        self._lock = threading.Lock()  # scrapes may overlap; the tallies are shared
        self._rounds = RoundTally()
        self._links = Monotone()

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        out = Families(COORDINATOR)
        with self._lock:
            self._rounds.add(list(snap.get("rounds", ())))
            _federation(out, snap, self._rounds)
            for agent in snap.get("agents", ()):
                _link(out, agent, self._links)
        _replicas(out, snap.get("replicas"))
        return iter(out)


class ReplicaCollector(Collector):
    """A standby replica's exporter: the replicas' families alone (it holds no round),
    over ``snapshot()``, the standby's status as plain data."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        out = Families(COORDINATOR)
        _replicas(out, self._snapshot().get("replicas"))
        return iter(out)


def _replicas(out: Families, replicas: Mapping[str, Any] | None) -> None:
    """The coordinator replicas (docs/failover.md): the term, who leads, each one's lag,
    the failovers; nothing with one coordinator."""
    if not replicas:
        return
    if int(replicas.get("term", 0)) > 0:
        out.add("skyfed_replica_term", int(replicas["term"]))
    leader = replicas.get("leader", "")
    for member in replicas.get("members", ()):
        out.add("skyfed_replica_leader", float(member["name"] == leader), member["name"])
        if int(member.get("lag", -1)) >= 0:
            out.add("skyfed_replica_lag_rounds", int(member["lag"]), member["name"])
    if replicas.get("leading"):
        out.add("skyfed_replica_alone", float(bool(replicas.get("alone", False))))
    failovers = list(replicas.get("failovers", ()))
    for cause in sorted({f["cause"] for f in failovers}):
        out.add("skyfed_failovers_total", sum(f["cause"] == cause for f in failovers), cause)
    if failovers:
        out.add("skyfed_failover_seconds", float(failovers[-1]["duration_s"]))


def _federation(out: Families, snap: Snapshot, tally: RoundTally) -> None:
    out.add(
        "skyfed_build_info", 1, VERSION, str(snap.get("task", "")), str(snap.get("exchange", ""))
    )
    out.add("skyfed_uptime_seconds", float(snap.get("uptime_s", 0.0)))
    out.add("skyfed_round", int(snap.get("round", 0)))
    out.add("skyfed_rounds_planned", int(snap.get("rounds_planned", 0)))
    out.add("skyfed_finished", float(bool(snap.get("finished", False))))
    out.add("skyfed_rounds_total", tally.count)
    out.histogram("skyfed_round_duration_seconds", tally.histogram(), tally.duration_s)
    out.add("skyfed_round_training_seconds_total", tally.train_s)
    out.add("skyfed_round_exchange_seconds_total", tally.exchange_s)
    for (direction, kind), value in sorted(tally.bytes.items()):
        out.add("skyfed_bytes_total", value, direction, kind)
    rounds = snap.get("rounds") or ()
    if rounds:
        out.add("skyfed_round_contributors", int(rounds[-1]["contributors"]))
        for where in ("memory", "disk"):
            staged = int(rounds[-1].get(f"staged_{where}_bytes", 0))
            out.add("skyfed_round_staged_bytes", staged, where)
        loss = float(rounds[-1]["mean_loss"])
        if math.isfinite(loss):
            out.add("skyfed_training_loss", loss)
    if int(snap.get("eval_round", -1)) >= 0 and math.isfinite(snap["eval_loss"]):
        out.add("skyfed_eval_loss", float(snap["eval_loss"]))
        out.add("skyfed_eval_round", int(snap["eval_round"]))
    if int(snap.get("eval_round", -1)) >= 0:
        for name, value in sorted(snap.get("eval_metrics", {}).items()):
            out.add("skyfed_eval_metric", float(value), name)
    states = {s: 0 for s in STATES}
    for agent in snap.get("agents", ()):
        states[agent["state"]] = states.get(agent["state"], 0) + 1
    for state, n in states.items():
        out.add("skyfed_agents", n, state)
    if "min_agents" in snap:
        out.add("skyfed_agents_expected", int(snap["min_agents"]))
    for code, n in sorted(snap.get("refusals", {}).items()):
        out.add("skyfed_refusals_total", n, code)
    if "checkpoints" in snap:
        out.add("skyfed_checkpoints_total", int(snap["checkpoints"]))
        out.add("skyfed_checkpoint_seconds_total", float(snap["checkpoint_s"]))


def _link(out: Families, agent: Mapping[str, Any], counters: Monotone) -> None:
    name = agent["name"]
    for direction in ("up", "down"):
        for kind, key in (("wire", f"bytes_{direction}"), ("raw", f"raw_bytes_{direction}")):
            if key in agent:
                value = counters((name, direction, kind), float(agent[key]))
                out.add("skyfed_link_bytes_total", value, name, direction, kind)
    codec = agent.get("codec", "")
    base = codec.split(":", 1)[0]
    for each in codec_names():
        out.add("skyfed_link_codec", float(each == base), name, each)
    switches = counters((name, "switches"), float(agent.get("codec_switches", 0)))
    out.add("skyfed_link_codec_switches_total", switches, name)
    if "streams" in agent:
        out.add("skyfed_link_streams", int(agent["streams"]), name)
    out.add("skyfed_link_rtt_seconds", float(agent.get("rtt_ms", 0.0)) / 1e3, name)
    out.add("skyfed_link_jitter_seconds", float(agent.get("jitter_ms", 0.0)) / 1e3, name)
    out.add("skyfed_link_loss_ratio", float(agent.get("loss_pct", 0.0)) / 100, name)
    goodput = float(agent.get("goodput_mbit", 0.0)) * 1e6 / 8  # Mbit/s -> bytes/s
    out.add("skyfed_link_goodput_bytes_per_second", goodput, name)
    ratio = float((agent.get("efficiency") or {}).get("ratio", math.nan))
    if math.isfinite(ratio):  # nan while the link's RTT or rate is unknown
        out.add("skyfed_link_exchange_floor_ratio", ratio, name)
    out.add("skyfed_link_last_round", int(agent.get("last_round", -1)), name)
    for metric, value in sorted(agent.get("metrics", {}).items()):
        out.add("skyfed_link_metric", float(value), name, metric)

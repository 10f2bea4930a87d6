"""The exporters read a snapshot: counters stay monotone, rounds are counted once."""

from __future__ import annotations

from dataclasses import asdict, replace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from skyfed import status as coordinator_status
from skyfed.coordinator.snapshot import to_data
from skyfed.metrics.agent import AgentCollector
from skyfed.metrics.coordinator import CoordinatorCollector
from skyfed.status import Efficiency


def round_stat(n: int, duration_s: float = 0.4, train_s: float = 0.3) -> dict:
    return {
        "round": n,
        "duration_s": duration_s,
        "train_s": train_s,
        "contributors": 2,
        "mean_loss": 2.5,
        "bytes_up": 100,
        "bytes_down": 50,
        "raw_bytes_up": 400,
        "raw_bytes_down": 200,
        "downlink_codec": "fp16",
    }


def agent(name: str, bytes_up: int) -> dict:
    return {
        "name": name,
        "state": "idle",
        "codec": "topk:density=0.05",
        "bytes_up": bytes_up,
        "bytes_down": 10,
        "rtt_ms": 120.0,
        "jitter_ms": 4.0,
        "loss_pct": 1.5,
        "goodput_mbit": 80.0,
        "codec_switches": 1,
        "last_round": 3,
    }


def scrape(collector) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class Status:
    def __init__(self) -> None:
        self.snap = {"round": 0, "rounds": [], "agents": [], "uptime_s": 1.0}

    def __call__(self) -> dict:
        return self.snap


def test_rounds_seen_in_two_scrapes_are_counted_once():
    status = Status()
    collector = CoordinatorCollector(status)
    status.snap["rounds"] = [round_stat(0), round_stat(1)]
    scrape(collector)
    status.snap["rounds"] = [round_stat(1), round_stat(2, duration_s=3.0)]
    got = scrape(collector)
    assert got[("skyfed_rounds_total", ())] == 3
    assert got[("skyfed_round_duration_seconds_count", ())] == 3
    assert got[("skyfed_round_duration_seconds_bucket", (("le", "0.5"),))] == 2
    assert got[("skyfed_round_duration_seconds_bucket", (("le", "5.0"),))] == 3
    assert got[("skyfed_round_exchange_seconds_total", ())] == 0.1 + 0.1 + 2.7
    assert got[("skyfed_bytes_total", (("direction", "up"), ("kind", "raw")))] == 1200


def test_link_bytes_stay_monotone_across_a_reconnect():
    status = Status()
    collector = CoordinatorCollector(status)
    status.snap["agents"] = [agent("aws-1", 1000)]
    scrape(collector)
    status.snap["agents"] = [agent("aws-1", 300)]  # a new session counts from zero
    got = scrape(collector)
    key = (("agent", "aws-1"), ("direction", "up"), ("kind", "wire"))
    assert got[("skyfed_link_bytes_total", key)] == 1300


def test_link_gauges_are_in_base_units_and_the_codec_is_an_enum():
    status = Status()
    status.snap["agents"] = [agent("gcp-1", 5)]
    got = scrape(CoordinatorCollector(status))
    one = (("agent", "gcp-1"),)
    assert got[("skyfed_link_rtt_seconds", one)] == 0.12
    assert got[("skyfed_link_loss_ratio", one)] == 0.015
    assert got[("skyfed_link_goodput_bytes_per_second", one)] == 10e6
    codecs = {k[1][1][1]: v for k, v in got.items() if k[0] == "skyfed_link_codec"}
    assert codecs == {"fp32": 0, "fp16": 0, "bf16": 0, "topk": 1, "ecsgd": 0}
    assert got[("skyfed_agents", (("state", "idle"),))] == 1


def test_agent_exporter_reads_its_snapshot():
    snap = {
        "name": "aws-1",
        "cloud": "aws",
        "connected": True,
        "round": 4,
        "rounds_applied": 5,
        "loss": 2.0,
        "bytes_up": 7,
        "bytes_down": 9,
        "codec": "ecsgd:bits=2",
    }
    got = scrape(AgentCollector(lambda: snap))
    assert got[("skyfed_agent_connected", ())] == 1
    assert got[("skyfed_agent_rounds_total", ())] == 5
    assert got[("skyfed_agent_bytes_total", (("direction", "down"),))] == 9
    assert got[("skyfed_agent_codec", (("codec", "ecsgd"),))] == 1


def test_link_streams_and_floor_ratio_come_from_the_status_of_a_striped_link():
    def link(name: str, streams: int, efficiency: Efficiency | None):
        return coordinator_status.AgentStatus(
            cloud="aws", name=name, state="idle", last_round=3, codec="fp16", rtt_ms=120.0,
            bytes_up=1, bytes_down=1, connected_s=5.0, codec_switches=0, refused=0,
            loss_pct=0.5, jitter_ms=1.0, goodput_mbit=40.0, streams=streams,
            efficiency=efficiency,
        )  # fmt: skip

    timed = Efficiency(
        round=3, exchange_s=2.4, floor_s=0.8, ratio=3.0, rtt_ms=120.0, rate_mbit=100.0,
        goodput_mbit=30.0, streams=4, limit="", cloud="aws", name="aws-1",
    )  # fmt: skip
    untimed_rate = replace(timed, ratio=float("nan"), name="az-1")
    status = coordinator_status.Status(
        round=4,
        agents=[link("aws-1", 4, timed), link("gcp-1", 1, None), link("az-1", 2, untimed_rate)],
        weights_digest="",
        uptime_s=9.0,
        rounds=[],
        finished=False,
        exchange="delta",
    )
    got = scrape(CoordinatorCollector(lambda: to_data(status)))
    streams = {k[1][0][1]: v for k, v in got.items() if k[0] == "skyfed_link_streams"}
    assert streams == {"aws-1": 4, "gcp-1": 1, "az-1": 2}
    ratios = {k[1][0][1]: v for k, v in got.items() if k[0] == "skyfed_link_exchange_floor_ratio"}
    assert ratios == {"aws-1": 3.0}  # no timed exchange, or no floor (nan): no sample


def test_replicas_show_the_term_the_leader_each_lag_and_the_failovers_by_cause():
    replicas = coordinator_status.ReplicaSet(
        replica="b",
        leading=True,
        term=9,
        leader="b",
        members=[
            coordinator_status.ReplicaInfo("a", "a:7443", "behind", 3, 2),
            coordinator_status.ReplicaInfo("b", "b:7443", "leader", 5, 0),
            coordinator_status.ReplicaInfo("c", "c:7443", "standby"),
        ],
        failovers=[
            coordinator_status.Failover(term=6, replica="a", cause="resigned", duration_s=0.4),
            coordinator_status.Failover(term=9, replica="b", cause="lease expired", duration_s=3.1),
        ],
        released=5,
        alone=False,
    )
    snap = {"round": 6, "rounds": [], "agents": [], "replicas": asdict(replicas)}
    got = scrape(CoordinatorCollector(lambda: snap))
    assert got[("skyfed_replica_term", ())] == 9
    assert got[("skyfed_replica_leader", (("replica", "b"),))] == 1
    assert got[("skyfed_replica_leader", (("replica", "a"),))] == 0
    assert got[("skyfed_replica_lag_rounds", (("replica", "a"),))] == 2
    assert ("skyfed_replica_lag_rounds", (("replica", "c"),)) not in got  # not known
    assert got[("skyfed_failovers_total", (("cause", "lease expired"),))] == 1
    assert got[("skyfed_failovers_total", (("cause", "resigned"),))] == 1
    assert got[("skyfed_failover_seconds", ())] == 3.1
    assert got[("skyfed_replica_alone", ())] == 0
    one = scrape(CoordinatorCollector(lambda: {"round": 0, "rounds": [], "agents": []}))
    assert not any(name.startswith(("skyfed_replica", "skyfed_failover")) for name, _ in one)

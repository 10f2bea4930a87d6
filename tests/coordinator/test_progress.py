"""What a waiting or running coordinator tells a person, and the history it leaves."""

from __future__ import annotations

import dataclasses
import json

from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.evaluate import EvalResult
from skyfed.coordinator.history import RunHistory, read, rounds
from skyfed.coordinator.observe import Observer
from skyfed.coordinator.progress import headline
from skyfed.coordinator.server import build_federation
from skyfed.coordinator.snapshot import waiting_for
from skyfed.status import Efficiency, RoundStats


def snap(**fields) -> dict:
    base = {"round": 0, "rounds": [], "agents": [], "finished": False, "min_agents": 3}
    return {**base, **fields}


def agent(name: str, bytes_up: int = 0) -> dict:
    return {"name": name, "state": "idle", "codec": "fp16", "bytes_up": bytes_up, "bytes_down": 0}


def test_a_waiting_coordinator_says_for_whom():
    waiting = snap(agents=[agent("gcp-1"), agent("aws-1")])
    assert waiting_for(waiting) == "waiting for 3 agents, 2 connected: aws-1, gcp-1"
    assert waiting_for(snap()) == "waiting for 3 agents, 0 connected"
    assert headline(waiting) == waiting_for(waiting)
    assert waiting_for(snap(agents=[agent("a"), agent("b"), agent("c")])) == ""


def test_headline_gives_round_of_planned_and_eta():
    rounds = [{"round": r, "duration_s": 2.0, "mean_loss": 3.0} for r in range(10)]
    line = headline(snap(rounds=rounds, round=10, rounds_planned=40, eval_round=9, eval_loss=2.5))
    assert line.startswith("round 10 of 40 · 2.00 s/round · ETA 1:00 · loss 3.000")
    assert "held-out 2.500 (round 9)" in line


def test_history_lines_carry_per_round_link_bytes(tmp_path):
    history = RunHistory(tmp_path / "rounds.jsonl")
    history.round({"round": 0}, [agent("aws-1", 100)])
    # Round 1's contribution carried a metric (taken as the round closed, RoundStats.metrics);
    # the status shows it still when round 2's line is written, which must not repeat it.
    reported = {"metrics": {"accuracy": 0.5}, "metrics_round": 1}
    history.round(
        {"round": 1, "metrics": {"aws-1": {"accuracy": 0.5}}}, [{**agent("aws-1", 250), **reported}]
    )
    history.round(
        {"round": 2, "metrics": {}}, [{**agent("aws-1", 40), **reported}]
    )  # reconnected: from 0
    history.eval(EvalResult(2, 1.5, 0.1, {"loss": 1.5, "accuracy": 0.25}), wall_s=9.0)
    lines = read(history.path)
    assert [x["links"]["aws-1"]["bytes_up"] for x in lines[:3]] == [100, 150, 40]
    assert [x["links"]["aws-1"].get("metrics") for x in lines[:3]] == [
        None,
        {"accuracy": 0.5},
        None,
    ]
    metrics = {"loss": 1.5, "accuracy": 0.25}
    assert lines[3] == {
        "kind": "eval",
        "round": 2,
        "eval_loss": 1.5,
        "eval_s": 0.1,
        "wall_s": 9.0,
        "metrics": metrics,
    }
    with open(history.path, "a") as f:
        f.write('{"kind": "round", "rou')  # a kill mid-write
    assert len(read(history.path)) == 4
    assert json.loads(history.path.read_text().splitlines()[0])["kind"] == "round"


def efficiency(name: str, round_: int, floor_s: float, ratio: float) -> dict:
    """A link's efficiency as status carries it (``Efficiency`` as data)."""
    e = Efficiency(
        round=round_, exchange_s=floor_s * ratio, floor_s=floor_s, ratio=ratio, rtt_ms=120.0,
        rate_mbit=100.0, goodput_mbit=30.0, streams=4, limit="", cloud="aws", name=name,
    )  # fmt: skip
    return dataclasses.asdict(e)


def test_a_rounds_links_timed_later_come_as_a_timing_line_folded_into_it(tmp_path):
    history = RunHistory(tmp_path / "rounds.jsonl")
    agents = [agent("aws-1", 100), agent("gcp-1", 100)]
    early = [efficiency("aws-1", 0, floor_s=0.5, ratio=2.0)]  # timed before it closed
    history.round({"round": 0, "links": early}, agents)
    history.timed(0, [efficiency("gcp-1", 0, floor_s=1.25, ratio=4.0)])  # the next upload's
    history.timed(7, [efficiency("gcp-1", 7, floor_s=1.0, ratio=1.0)])  # never written: none
    first, timing = read(history.path)
    assert first["kind"] == "round" and "floor_s" not in first["links"]["gcp-1"]
    assert first["floor_s"] == 0.5
    assert timing == {
        "kind": "timing",
        "round": 0,
        "links": {"gcp-1": {"exchange_s": 5.0, "floor_s": 1.25, "ratio": 4.0, "limit": ""}},
        "floor_s": 1.25,  # the round waits for its slowest link
    }
    (folded,) = rounds(read(history.path)).values()
    links = folded["links"]
    assert (links["aws-1"]["floor_s"], links["aws-1"]["ratio"]) == (0.5, 2.0)
    assert (links["gcp-1"]["exchange_s"], links["gcp-1"]["ratio"]) == (5.0, 4.0)
    assert links["gcp-1"]["bytes_up"] == 100 and folded["floor_s"] == 1.25


def test_rounds_jsonl_holds_one_line_per_closed_round(tmp_path, pki):
    """Links timed after their round's line add a timing line, never the round again, so
    summing the round lines' bytes counts every byte once."""
    config = CoordinatorConfig.from_flat(certs=pki.directory, run_dir=tmp_path, eval_every=0)
    federation = build_federation(config)
    observer = Observer(federation, config)
    for r in range(3):
        with federation.cond:
            federation.rounds.history.append(RoundStats(round=r, duration_s=2.0, train_s=1.0))
        observer.poll()
        observer.poll()  # nothing new: nothing written
        timed = Efficiency(**efficiency("aws-1", r, floor_s=0.25, ratio=3.0))
        with federation.cond:
            federation.rounds.history[r].links.append(timed)  # as the next contribution does
        observer.poll()
        observer.poll()
    lines = read(tmp_path / "rounds.jsonl")
    assert [x["round"] for x in lines if x["kind"] == "round"] == [0, 1, 2]
    assert [(x["round"], x["floor_s"]) for x in lines if x["kind"] == "timing"] == [
        (0, 0.25),
        (1, 0.25),
        (2, 0.25),
    ]
    assert rounds(lines)[1]["links"]["aws-1"]["ratio"] == 3.0

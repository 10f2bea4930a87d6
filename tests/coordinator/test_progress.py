"""What a waiting or running coordinator tells a person, and the history it leaves."""

from __future__ import annotations

import json

from skyfed.coordinator.evaluate import EvalResult
from skyfed.coordinator.history import RunHistory, read
from skyfed.coordinator.progress import headline
from skyfed.coordinator.snapshot import waiting_for


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
    history.round({"round": 1}, [agent("aws-1", 250)])
    history.round({"round": 2}, [agent("aws-1", 40)])  # reconnected: counts from zero
    history.eval(EvalResult(2, 1.5, 0.1), wall_s=9.0)
    lines = read(history.path)
    assert [x["links"]["aws-1"]["bytes_up"] for x in lines[:3]] == [100, 150, 40]
    assert lines[3] == {"kind": "eval", "round": 2, "eval_loss": 1.5, "eval_s": 0.1, "wall_s": 9.0}
    with open(history.path, "a") as f:
        f.write('{"kind": "round", "rou')  # a kill mid-write
    assert len(read(history.path)) == 4
    assert json.loads(history.path.read_text().splitlines()[0])["kind"] == "round"

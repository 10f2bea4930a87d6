"""``skyfed report`` over a recorded history: every figure, a clear error without one."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
import time

import matplotlib.pyplot as plt
import numpy as np
import pytest

from skyfed.coordinator.evaluate import EvalResult
from skyfed.coordinator.history import RunHistory
from skyfed.procs import command, wait_for_file
from skyfed.report import make_report, plots
from skyfed.report.data import load
from skyfed.report.plots import STYLE
from skyfed.status import Efficiency
from tests.conftest import RawAgent, credentials
from tests.coordinator.test_bad_input import contribution, deltas, join, send

PNG = b"\x89PNG\r\n\x1a\n"


def record_run(run_dir, rounds: int = 8, timed: bool = False) -> None:
    """``timed``: each round's links' exchanges against their floors arrive a round late,
    as agents report them."""
    history = RunHistory(run_dir / "rounds.jsonl")
    totals = {"aws-1": 0, "gcp-1": 0}
    for r in range(rounds):
        agents = []
        for name, rtt in (("aws-1", 20.0), ("gcp-1", 140.0 + 10 * r)):
            totals[name] += 1000 if r < 4 else 60  # topk from round 4 on
            codec = "fp16" if r < 4 or name == "aws-1" else "topk"
            agents.append(
                {
                    "name": name,
                    "codec": codec,
                    "state": "idle",
                    "rtt_ms": rtt,
                    "jitter_ms": 1.0,
                    "loss_pct": 0.5 * (name == "gcp-1"),
                    "goodput_mbit": 50.0,
                    "bytes_up": totals[name],
                    "bytes_down": totals[name],
                    "raw_bytes_up": 2000 * (r + 1),
                    "raw_bytes_down": 2000 * (r + 1),
                }
            )
        record = {"round": r, "duration_s": 1.0, "train_s": 0.6, "exchange_s": 0.4}
        record.update(contributors=2, mean_loss=4.0 - 0.3 * r, wall_s=2.0 + r)
        record.update(bytes_up=2000, bytes_down=2000, raw_bytes_up=4000, raw_bytes_down=4000)
        history.round(record, agents)
        if timed and r > 0:
            history.timed(r - 1, [timing(a["name"], r - 1) for a in agents])
        if r % 4 == 3:
            history.eval(EvalResult(r, 3.9 - 0.3 * r, 0.2), wall_s=2.5 + r)


def timing(name: str, round_: int) -> dict:
    """A link's efficiency in ``round_``, as status carries it: 0.3 s over a 0.1 s floor
    (0.15 s on the far link from round 4, on topk)."""
    floor_s = 0.15 if name == "gcp-1" and round_ >= 4 else 0.1
    e = Efficiency(
        round=round_, exchange_s=0.3, floor_s=floor_s, ratio=0.3 / floor_s, rtt_ms=140.0,
        rate_mbit=100.0, goodput_mbit=10.0, streams=2, limit="", cloud="gcp", name=name,
    )  # fmt: skip
    return dataclasses.asdict(e)


def test_the_round_time_figure_draws_the_floor_where_links_were_timed(tmp_path):
    record_run(tmp_path, timed=True)
    data = load(tmp_path)
    assert data.column("floor_s")[:7] == [0.1] * 4 + [0.15] * 3  # the slowest link's
    assert math.isnan(data.column("floor_s")[7])  # the last round is never timed
    with plt.rc_context(STYLE):
        drawn = plots._time_split(data)
        untimed = tmp_path / "untimed"
        untimed.mkdir()
        record_run(untimed)
        bare = plots._time_split(load(untimed))
    labels = [t.get_text() for t in drawn.axes[0].get_legend().get_texts()]
    assert "training + exchange floor" in labels
    assert "training + exchange floor" not in [
        t.get_text() for t in bare.axes[0].get_legend().get_texts()
    ]
    plt.close(drawn)
    plt.close(bare)
    make_report(tmp_path)
    assert (tmp_path / "time.png").read_bytes()[:8] == PNG


def test_report_writes_every_figure_and_links_them(tmp_path):
    record_run(tmp_path)
    page = make_report(tmp_path)
    html = page.read_text()
    for name in ("loss", "time", "bytes", "efficiency", "links"):
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == PNG
        assert f'src="{name}.png"' in html
    assert "held-out loss" in html and "1.8000 (round 7)" in html


def test_report_of_a_directory_without_history_is_a_usage_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "skyfed", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "rounds.jsonl not found" in result.stderr and "--run-dir" in result.stderr


def test_a_restarted_coordinators_lines_replace_the_earlier_ones(tmp_path):
    record_run(tmp_path, rounds=3)
    with open(tmp_path / "rounds.jsonl", "a") as f:
        line = {"kind": "round", "round": 2, "duration_s": 9.0, "train_s": 1.0}
        line.update(exchange_s=8.0, contributors=1, mean_loss=1.0, wall_s=30.0, links={})
        line.update(bytes_up=1, bytes_down=1, raw_bytes_up=1, raw_bytes_down=1)
        f.write(json.dumps(line) + "\n")
    data = load(tmp_path)
    assert [r["round"] for r in data.rounds] == [0, 1, 2]
    assert data.rounds[-1]["duration_s"] == 9.0


def test_the_report_marks_each_failover_on_its_round_and_wall_time_axes(tmp_path):
    record_run(tmp_path)
    history = RunHistory(tmp_path / "rounds.jsonl")
    history.failover(
        {"term": 9, "replica": "b", "previous": "a", "cause": "lease expired"}
        | {"duration_s": 2.1, "round": 5, "lost_rounds": 0, "wall_s": 6.5}
    )
    data = load(tmp_path)
    assert [f["round"] for f in data.failovers] == [5]
    assert [r["round"] for r in data.rounds] == list(range(8))  # not a round line
    with plt.rc_context(STYLE):
        loss, time_split = plots._loss(data), plots._time_split(data)
    by_round, by_wall = loss.axes
    marks = {
        ax: [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
        for ax in (by_round, by_wall, time_split.axes[0])
    }
    assert marks == {by_round: [4.5], by_wall: [6.5], time_split.axes[0]: [4.5]}
    labels = [t.get_text() for t in by_round.get_legend().get_texts()]
    assert "failover (new leader)" in labels
    plt.close(loss)
    plt.close(time_split)


def record_coinciding(run_dir, names: list[str], rounds: int = 10) -> None:
    """Links on one codec: the same bytes every round, so their lines coincide."""
    history = RunHistory(run_dir / "rounds.jsonl")
    total = 0
    for r in range(rounds):
        total += 1000 * (1 + r % 3)
        agents = [
            {"name": n, "codec": "fp16", "state": "idle", "rtt_ms": 20.0, "loss_pct": 0.0}
            | {"bytes_up": total, "bytes_down": total}
            | {"raw_bytes_up": 4000 * (r + 1), "raw_bytes_down": 4000 * (r + 1)}
            for n in names
        ]
        record = {"round": r, "duration_s": 1.0, "train_s": 0.6, "exchange_s": 0.4}
        record.update(contributors=len(names), mean_loss=3.0, wall_s=2.0 + r)
        record.update(bytes_up=2000, bytes_down=2000, raw_bytes_up=4000, raw_bytes_down=4000)
        history.round(record, agents)


def pixels_of(figure: plt.Figure, color: str, path) -> int:
    figure.savefig(path)
    plt.close(figure)
    image = plt.imread(path)[..., :3]
    rgb = np.array([int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(image - rgb).max(axis=-1) < 0.08).sum())


def test_links_whose_lines_coincide_all_stay_visible(tmp_path):
    alone, three = tmp_path / "alone", tmp_path / "three"
    alone.mkdir(), three.mkdir()
    record_coinciding(alone, ["aws-1"])
    record_coinciding(three, ["aws-1", "gcp-1", "azure-1"])
    first = plots.PALETTE[0]  # aws-1's colour, drawn first, under the other two
    with plt.rc_context(STYLE):
        drawn_alone = pixels_of(plots._bytes(load(alone)), first, tmp_path / "a.png")
        drawn_under = pixels_of(plots._bytes(load(three)), first, tmp_path / "b.png")
    assert drawn_under >= 0.6 * drawn_alone, (drawn_under, drawn_alone)


def test_the_efficiency_figure_draws_each_timed_links_ratio(tmp_path):
    record_run(tmp_path, timed=True)
    data = load(tmp_path)
    assert data.links["gcp-1"].ratio[:7] == pytest.approx([3.0] * 4 + [2.0] * 3)
    assert math.isnan(data.links["gcp-1"].ratio[7])
    with plt.rc_context(STYLE):
        figure = plots._efficiency(data)
    labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert labels[:2] == ["aws-1", "gcp-1"]
    plt.close(figure)
    make_report(tmp_path)
    assert (tmp_path / "efficiency.png").read_bytes()[:8] == PNG


def test_the_run_summary_and_the_report_give_one_wall_time(pki, tmp_path, reaped):
    """The coordinator's end-of-run summary and ``skyfed report`` both count from the
    coordinator's start to its last round's close (not its start-up or final wait)."""
    run_dir, port_file = tmp_path / "run", tmp_path / "port"
    argv = command(
        "coordinator", "serve", "--listen", "127.0.0.1:0", "--certs", str(pki.directory),
        "--min-agents", "1", "--rounds", "2", "--codec", "fp32", "--port-file", str(port_file),
        "--run-dir", str(run_dir), "--no-progress",
    )  # fmt: skip
    proc = reaped.start("coordinator", argv)
    port = int(wait_for_file(port_file, 60, proc))
    agent = RawAgent(port, credentials(pki.directory, "aws-1"))
    try:
        join(agent, "aws", "aws-1")
        for round_ in (0, 1):
            send(agent, *contribution(deltas(round_ + 1), round=round_))
            assert agent.expect("receipt").receipt.accepted
            assert agent.expect("round_end").round_end.round == round_
        time.sleep(2)  # the summary must not count the time after the last round
    finally:
        agent.close()
    assert proc.wait(timeout=60) == 0, reaped.log("coordinator")[-2000:]
    summary = re.search(r"2 in ([0-9.]+) s wall", reaped.log("coordinator"))
    assert summary, reaped.log("coordinator")[-2000:]
    page = make_report(run_dir).read_text()
    reported = re.search(r"<th>wall time</th><td>([0-9.]+) s", page)
    assert reported and reported.group(1) == summary.group(1)
    assert float(summary.group(1)) == pytest.approx(load(run_dir).rounds[-1]["wall_s"], abs=0.05)

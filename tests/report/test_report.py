"""``skyfed report`` over a recorded history: every figure, a clear error without one."""

from __future__ import annotations

import json
import subprocess
import sys

from skyfed.coordinator.evaluate import EvalResult
from skyfed.coordinator.history import RunHistory
from skyfed.report import make_report

PNG = b"\x89PNG\r\n\x1a\n"


def record_run(run_dir, rounds: int = 8) -> None:
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
        if r % 4 == 3:
            history.eval(EvalResult(r, 3.9 - 0.3 * r, 0.2), wall_s=2.5 + r)


def test_report_writes_every_figure_and_links_them(tmp_path):
    record_run(tmp_path)
    page = make_report(tmp_path)
    html = page.read_text()
    for name in ("loss", "time", "bytes", "links"):
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
    from skyfed.report.data import load

    data = load(tmp_path)
    assert [r["round"] for r in data.rounds] == [0, 1, 2]
    assert data.rounds[-1]["duration_s"] == 9.0

"""``bench/time_to_target.py``'s own logic on a tiny model: the data-parallel leg's real
Gloo processes, the target read from a coordinator's history, the bytes counted to it and
the last line. The lab runs themselves are the bench's (no timings here)."""

from __future__ import annotations

import argparse
import importlib
import math
import re
from pathlib import Path

import pytest
import torch

from skyfed.coordinator.evaluate import EvalResult
from skyfed.coordinator.history import ROUNDS_FILE, RunHistory
from skyfed.tasks import load_task

BENCH = Path(__file__).resolve().parents[2] / "bench"
TINY = "chargpt?n_layer=1&d_model=16&n_head=2&block=16&batch=4&eval_batches=2"
LAST = re.compile(
    r"^time to target: \d+\.\d\dx data-parallel's wall-clock, \d+x fewer bytes \(.+\)$"
)


@pytest.fixture
def bench(monkeypatch):
    """The bench's modules as it imports them (its folder on the path, for the spawned
    data-parallel ranks too)."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("time_to_target"), importlib.import_module("baseline")


@pytest.mark.multiprocess
def test_the_gloo_data_parallel_leg_trains_what_the_baseline_trains_and_counts_its_bytes(bench):
    _, baseline = bench
    got = baseline.gloo_data_parallel(TINY, 0, 3, 6)
    torch.manual_seed(0)
    reference = baseline.DataParallel(load_task(TINY), 0, 3)
    for _ in range(6):
        reference.step()
    assert got.loss == pytest.approx(reference.eval_loss(), rel=1e-6)
    # every site's FP32 gradient up and the FP32 mean down, every step, framed as skyfed's
    payload, _ = baseline.fp32_payload_bytes(reference.model)
    assert got.bytes == reference.bytes == 6 * 2 * 3 * payload
    assert 0 < got.allreduce_s <= got.wall_s


def _history(run_dir: Path, evals: list[float]) -> None:
    """A coordinator's history of ``len(evals)`` rounds (2 s each, from 10 s after its
    start), 1000 B up and 3000 B down a round, each round evaluated after it closed, and
    each round's links timed by the next contribution."""
    history = RunHistory(run_dir / ROUNDS_FILE)
    agents = [{"name": "aws-1", "bytes_up": 0, "bytes_down": 0}]
    for r, loss in enumerate(evals):
        record = {"round": r, "duration_s": 2.0, "train_s": 1.5, "wall_s": 12.0 + 2 * r}
        codec = "fp16" if r < 2 else "ecsgd"
        history.round(
            {**record, "bytes_up": 1000, "bytes_down": 3000, "downlink_codec": codec}, agents
        )
        if r:
            history.timed(r - 1, [{"name": "aws-1", "exchange_s": 0.5, "floor_s": 0.1}])
        history.eval(EvalResult(r, loss, 0.01), wall_s=13.0 + 2 * r)


def test_the_target_is_the_first_evaluation_under_it_and_counts_the_rounds_to_it(bench, tmp_path):
    ttt, _ = bench
    assert ttt.read_target(tmp_path, 2.0) is None  # no history yet
    _history(tmp_path, [3.0, 2.5, 1.99, 2.1, 1.8])
    got = ttt.read_target(tmp_path, 2.0)
    assert (got.reached, got.round, got.loss) == (True, 2, 1.99)
    assert got.wall_s == pytest.approx(6.0)  # round 0 opened at 10 s, round 2 closed at 16 s
    assert got.train_s == pytest.approx(4.5)
    assert got.bytes == 3 * 4000  # each round's line once: its timing line adds no bytes
    assert got.codecs == "fp16 x2, ecsgd x1"
    missed = ttt.read_target(tmp_path, 1.0)
    assert (missed.reached, missed.round, missed.bytes) == (False, 4, 5 * 4000)


def test_the_last_line_gives_the_wall_clock_and_bytes_against_data_parallel(bench, tmp_path):
    ttt, baseline = bench
    dp = baseline.GlooResult(steps=100, wall_s=50.0, allreduce_s=5.0, loss=2.0, bytes=10**9)
    reached = ttt.Reached(True, 1, 1.99, wall_s=55.0, train_s=50.0, bytes=10**5)
    run = ttt.SkyfedRun("far-gigabit", "default", 64, reached, link_bytes=2 * 10**5)
    args = argparse.Namespace(
        inner_lr=4.5e-3, task="chargpt", task_label="chargpt", steps=100, seed=0
    )
    line = ttt.time_to_target_line(dp, run, args)
    assert LAST.match(line), line
    assert line.startswith("time to target: 1.10x data-parallel's wall-clock, 10000x fewer")
    assert "far-gigabit, H=64" in line and "NOT REACHED" not in line
    lines = ttt.describe(dp, [run], args)
    assert lines[-1] == line and "1.28x S" in lines[3] and math.isfinite(run.steps)

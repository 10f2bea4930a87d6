"""``bench/scale.py --phases``: a round's critical path from real processes' DEBUG marks,
its segments adding up to the round."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scale.py"
SEGMENTS = (
    "last round's apply + digest",
    "training",
    "encode",
    "upload + check",
    "close",
    "checkpoint + round ends",
)


def test_the_phases_of_a_round_add_up_to_it(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--params", "1M", "--codecs", "topk", "--rounds", "3"]
        + ["--phases", "--keep", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    assert "1M topk: critical path, medians over rounds 1..1" in out, out
    ms = {
        m[1]: int(m[2])
        for m in re.finditer(r"^\| (?:\*\*)?(.+?)(?:\*\*)? \| (-?\d+) \|$", out, re.M)
    }
    # The first segment may dip below zero at 1M: an agent can apply the last round and
    # start training while the coordinator still writes its status before the opening.
    assert all(ms[s] >= 0 for s in SEGMENTS[1:]), ms
    # One round: each segment is that round's, rounded to the millisecond.
    assert abs(sum(ms[s] for s in SEGMENTS) - ms["round (open to round ends)"]) <= len(SEGMENTS)
    assert ms["of which, coordinator: mean + outer step"] <= ms["close"]

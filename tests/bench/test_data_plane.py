"""``bench/data_plane.py``: both transports move every byte, both ways, over real mTLS."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "data_plane.py"


def test_grpc_and_plain_tls_each_move_the_bytes_both_ways_and_are_costed() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--mb", "8", "--reps", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    rows = re.findall(r"^\| (grpc|tls) \| (up|down) \| ([\d.]+) \| ([\d.]+) \|$", out, re.M)
    assert sorted((t, d) for t, d, _, _ in rows) == [
        ("grpc", "down"),
        ("grpc", "up"),
        ("tls", "down"),
        ("tls", "up"),
    ], out
    # The bench exits non-zero when either end moved other than every byte; here each
    # side also spent CPU on them.
    assert all(float(recv) > 0 and float(send) > 0 for _, _, recv, send in rows), out

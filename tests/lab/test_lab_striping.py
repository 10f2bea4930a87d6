"""On a lossy lab link, the N the monitor picks moves several times the bytes of one stream.

A ratio inside one run, not a timing: the link's first round runs on one connection (the
monitor has measured nothing yet), later ones on the N it chose; the coordinator's status
holds every round's goodput per link with its N (``docs/striping.md``). Each round moves
4 MB each way (FP32, 1M parameters): at 0.5 % loss about 30 losses a transfer, so both
figures are past slow start; in 64 KiB chunks, so that 16 streams each carry several
(the 1 MiB default cuts the model's four 1 MB tensors into four chunks: four streams'
worth).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest

from skyfed.lab.federation import Federation, FederationSpec
from skyfed.lab.selfcheck import CheckSettings, check_lab
from skyfed.lab.topology import COORDINATOR, Lab

pytestmark = pytest.mark.lab

TASK = "skyfed.tasks.examples:wide?params=1M"
ROUNDS = 6


def test_the_monitors_streams_move_three_times_the_bytes_of_one_on_a_lossy_link(
    make_lab: Callable[..., Lab], tmp_path: Path
) -> None:
    lab = make_lab("aws-1=cross-region")
    for report in check_lab(lab, CheckSettings(probes=2000, rate_duration_s=1.0)):
        print(report.summary())
    status = tmp_path / "status.json"
    spec = FederationSpec(
        rounds=ROUNDS,
        round_deadline_s=300.0,
        coordinator_args=(
            *("--task", TASK, "--codec", "fp32", "--max-streams", "16"),
            *("--link-rate-mbit", "100", "--max-chunk-bytes", str(64 << 10)),
            *("--status-file", str(status)),
        ),
        agent_args=("--task", TASK, "--local-steps", "2"),
    )
    fed = Federation(lab, spec, tmp_path)
    fed.start()
    codes = fed.wait(timeout_s=600)
    logs = "\n".join(f"--- {h}\n{fed.tail(h)}" for h in (COORDINATOR, "aws-1"))
    assert all(code == 0 for code in codes.values()), f"{codes}\n{logs}"
    rounds = json.loads(status.read_text())["rounds"]
    links = [link for r in rounds for link in r.get("links", [])]
    for link in links:  # the JSON writes a non-finite figure as "NaN"
        print(
            f"round {link['round']}: {link['streams']} streams, "
            f"{float(link['goodputMbit']):.1f} Mbit/s, {float(link['ratio']):.1f}x floor, "
            f"{link['limit']}"
        )
    one = [float(link["goodputMbit"]) for link in links if link["streams"] == 1]
    widest = max(link["streams"] for link in links)
    chosen = [float(link["goodputMbit"]) for link in links if link["streams"] == widest]
    assert one and widest > 1, logs
    ratio = statistics.median(chosen) / statistics.median(one)
    print(f"{widest} streams move {ratio:.1f}x the bytes per second of one")
    assert ratio >= 3.0, logs

"""The README's first command: the local demo runs, trains and ends bit-identical."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiprocess


def test_demo_runs_and_reports_identical_agents(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "skyfed",
            "demo",
            "--rounds",
            "3",
            "--local-steps",
            "1",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "all agents bit-identical" in result.stdout
    assert re.search(r"training \d+ ms \+ exchange \d+ ms", result.stdout), result.stdout[-3000:]
    assert "smaller" in result.stdout
    report = tmp_path / "run" / "report.html"
    assert report.exists() and "report" in result.stdout
    assert "held-out loss" in result.stdout

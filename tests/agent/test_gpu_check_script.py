"""The GPU check (``scripts/gpu_check.py``) runs its CPU form in CI, so the script a lent
GPU machine runs is known to work before the machine is asked for: a group of one rank (the
path every CUDA site takes) once failed there on pickling its own payloads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.mark.multiprocess
@pytest.mark.timeout(700)
def test_the_gpu_check_passes_on_cpu_with_gloo():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUMMARY: PASS (5/5 checks, device=cpu)" in done.stdout

"""Every command starts without a warning on stderr: a warning from a dependency (a
deprecated API) would lead every start and break the one-line errors users get."""

from __future__ import annotations

import subprocess
import sys

import pytest

COMMANDS = {
    "certs": ["-m", "skyfed.certs"],
    "coordinator": ["-m", "skyfed.coordinator"],
    "agent": ["-m", "skyfed.agent"],
    "skyfed report": ["-m", "skyfed", "report"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_starts_without_a_warning(name):
    argv = [sys.executable, *COMMANDS[name], "--help"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr

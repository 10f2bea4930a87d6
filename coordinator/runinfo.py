"""What was run, ``RUN_DIR/run.json``: the task, the codec, the whole configuration, the
versions of skyfed and what it runs on, and when it started; written at each start (a
restarted coordinator's replaces the last), read by ``skyfed report``
(docs/operations.md, "Run directory")."""

from __future__ import annotations

import dataclasses
import json
import platform
import socket
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from skyfed.coordinator.config import CoordinatorConfig
from skyfed.files import write_text_atomic

RUN_FILE = "run.json"
PACKAGES = ("skyfed", "torch", "grpcio", "protobuf", "cryptography", "numpy", "zstandard")
"""The versions a run's numbers depend on."""


def describe(config: CoordinatorConfig) -> dict[str, Any]:
    """The run as data: what a reader needs to tell two runs' figures apart."""
    return {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "task": config.task,
        "codec": config.codec,
        "exchange": config.rounds.exchange,
        "configuration": json.loads(json.dumps(dataclasses.asdict(config), default=str)),
        "versions": {"python": platform.python_version(), **_versions()},
    }


def write(run_dir: Path, config: CoordinatorConfig) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(run_dir / RUN_FILE, json.dumps(describe(config), indent=1))


def _versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found

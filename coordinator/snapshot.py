"""The status as plain data (dicts, lists, numbers), for exporters, the history and the CLI:
what they read is JSON-shaped, so a new status field reaches them without an edit here."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from skyfed.coordinator.status import Status


def to_data(status: Status) -> dict[str, Any]:
    """Every field of ``status`` by name; nested dataclasses become dicts."""
    return dataclasses.asdict(status)


def run_wall_s(rounds: Sequence[Mapping[str, Any]]) -> float:
    """A run's wall time: seconds from the coordinator's start to the close of its last
    round (each round's ``wall_s``). The run summary and the run report both say this;
    the start-up before the rounds and the wait for the agents after them are not in it."""
    return float(rounds[-1]["wall_s"]) if rounds else 0.0


def waiting_for(snap: dict[str, Any]) -> str:
    """Why no round runs yet ("waiting for 3 agents, 2 connected: aws-1, gcp-1; azure-1
    down: rank 3 (dp 1, tp 1) on host-b killed by SIGKILL"), or ""."""
    needed = int(snap.get("min_agents", 1))
    agents = snap.get("agents", ())
    names = sorted(a["name"] for a in agents if a.get("state") not in ("disconnected", "down"))
    if snap.get("rounds") or snap.get("finished") or len(names) >= needed:
        return ""
    connected = f": {', '.join(names)}" if names else ""
    down = "".join(
        f"; {a['name']} down: {a.get('last_error', '')}"
        for a in sorted(agents, key=lambda a: a["name"])
        if a.get("state") == "down"
    )
    return f"waiting for {needed} agents, {len(names)} connected{connected}{down}"

"""What a run leaves in its directory, as columns ready to plot."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyfed.coordinator.history import ROUNDS_FILE, read, rounds
from skyfed.coordinator.runinfo import RUN_FILE

STATUS_FILE = "status.json"


@dataclass(slots=True)
class LinkSeries:
    """One agent's link, one entry per round it appears in."""

    rounds: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    codec: list[str] = field(default_factory=list)
    rtt_ms: list[float] = field(default_factory=list)
    loss_pct: list[float] = field(default_factory=list)
    bytes_up: list[int] = field(default_factory=list)
    bytes_down: list[int] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    """Its exchange against its floor (NaN: not timed, as a run's last round)."""


@dataclass(slots=True)
class RunData:
    """A run's rounds (in order, one per round), its evaluations, its last status and
    what was run (``run.json``; None from a coordinator that did not write one)."""

    rounds: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    status: dict[str, Any] | None
    links: dict[str, LinkSeries]
    run: dict[str, Any] | None = None
    failovers: list[dict[str, Any]] = field(default_factory=list)
    """Each coordinator replica that took over: its first round, ``wall_s``, cause and
    duration (docs/failover.md)."""

    def column(self, key: str) -> list[float]:
        return [float(r.get(key, math.nan)) for r in self.rounds]

    def metrics(self) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
        """Every named metric the run recorded, by name, then by source: ``held-out``
        (the coordinator's evaluations, less their loss: the loss figure's) or a site's
        name (what it reported with its contributions); each source's (rounds, values)."""
        out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}

        def add(name: str, source: str, round_: int, value: float) -> None:
            rounds, values = out.setdefault(name, {}).setdefault(source, ([], []))
            rounds.append(round_)
            values.append(float(value))

        for e in self.evals:
            for name, value in sorted(e.get("metrics", {}).items()):
                if name != "loss":
                    add(name, "held-out", int(e["round"]), value)
        for r in self.rounds:
            for site, link in sorted(r.get("links", {}).items()):
                for name, value in sorted(link.get("metrics", {}).items()):
                    add(name, site, int(r["round"]), value)
        return out

    def wall_at(self, round_: int) -> float:
        """Wall time (s) the given round closed at; NaN if unknown."""
        for r in self.rounds:
            if r["round"] == round_:
                return float(r["wall_s"])
        return math.nan


def load(run_dir: Path) -> RunData:
    """Read ``run_dir``; a clear error if it holds no history."""
    path = run_dir / ROUNDS_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: run the coordinator with --run-dir {run_dir} to record one"
        )
    lines = read(path)
    by_round = rounds(lines)
    # A restarted coordinator appends: the latest evaluation of a round wins.
    evals = {int(x["round"]): x for x in lines if x.get("kind") == "eval"}
    ordered = [by_round[k] for k in sorted(by_round)]
    # A replica that took over (docs/failover.md).
    failovers = [x for x in lines if x.get("kind") == "failover"]
    status, run = (_json(run_dir / name) for name in (STATUS_FILE, RUN_FILE))
    evals_ordered = [evals[k] for k in sorted(evals)]
    return RunData(ordered, evals_ordered, status, _links(ordered), run, failovers)


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _links(rounds: list[dict[str, Any]]) -> dict[str, LinkSeries]:
    links: dict[str, LinkSeries] = {}
    for r in rounds:
        for name, link in sorted(r.get("links", {}).items()):
            s = links.setdefault(name, LinkSeries())
            s.rounds.append(int(r["round"]))
            s.wall_s.append(float(r["wall_s"]))
            s.codec.append(str(link.get("codec", "")).split(":", 1)[0])
            s.rtt_ms.append(float(link.get("rtt_ms", math.nan)))
            s.loss_pct.append(float(link.get("loss_pct", math.nan)))
            s.bytes_up.append(int(link.get("bytes_up", 0)))
            s.bytes_down.append(int(link.get("bytes_down", 0)))
            s.ratio.append(float(link.get("ratio", math.nan)))
    return links

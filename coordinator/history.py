"""A run's per-round history, ``RUN_DIR/rounds.jsonl``: one JSON object per line, appended
as rounds close, read by ``skyfed report`` (docs/operations.md, "Run directory").

A ``"kind": "round"`` line holds the round's figures and, under ``links``, each agent's
codec, RTT, jitter, loss and the bytes (wire and fp32) its link carried since the
previous round; a
``"kind": "eval"`` line holds a held-out evaluation, which finishes later than its round.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from skyfed.coordinator.evaluate import EvalResult

ROUNDS_FILE = "rounds.jsonl"
LINK_FIELDS = ("codec", "state", "rtt_ms", "jitter_ms", "loss_pct", "goodput_mbit", "streams")
# Session totals a line holds as their increase since the previous round, in bytes.
COUNTERS = ("bytes_up", "bytes_down", "raw_bytes_up", "raw_bytes_down")


class RunHistory:
    """Appends to ``path``; a restarted coordinator appends to the same file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._totals: dict[tuple[str, str], int] = {}  # (agent, counter) -> last total seen
        self._lock = threading.Lock()  # rounds come from the observer, evaluations from a worker

    def round(self, record: dict[str, Any], agents: list[dict[str, Any]]) -> dict[str, Any]:
        """Append one closed round with the links' state as ``agents`` show it now."""
        line = {"kind": "round", **record, "links": {a["name"]: self._link(a) for a in agents}}
        self._append(line)
        return line

    def eval(self, result: EvalResult, wall_s: float) -> None:
        self._append(
            {
                "kind": "eval",
                "round": result.round,
                "eval_loss": result.loss,
                "eval_s": result.seconds,
                "wall_s": wall_s,
            }
        )

    def close(self) -> None:
        """Every line is flushed as written; nothing to do."""

    def _link(self, agent: dict[str, Any]) -> dict[str, Any]:
        link = {k: agent[k] for k in LINK_FIELDS if k in agent}
        for key in COUNTERS:
            total = int(agent.get(key, 0))
            last = self._totals.get((agent["name"], key), 0)
            # A new session counts from zero again: all of its bytes are new.
            link[key] = total - last if total >= last else total
            self._totals[(agent["name"], key)] = total
        return link

    def _append(self, line: dict[str, Any]) -> None:
        text = json.dumps(line, default=str) + "\n"
        with self._lock, open(self.path, "a") as f:
            f.write(text)


def read(path: Path) -> list[dict[str, Any]]:
    """Every line of a history file; a torn last line (a kill mid-write) is skipped."""
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return lines

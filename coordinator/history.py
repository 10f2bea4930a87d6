"""A run's per-round history, ``RUN_DIR/rounds.jsonl``: one JSON object per line, appended
as rounds close, read by ``skyfed report`` (docs/operations.md, "Run directory").

One ``"kind": "round"`` line per closed round holds the round's figures and, under
``links``, each agent's codec, RTT, jitter, loss and the bytes (wire and fp32) its link
carried since the previous round (summing its bytes over the lines counts every byte
once), and the named metrics its site reported with its contribution to that round
(``metrics``, docs/own-loop.md). A ``"kind": "eval"`` line holds a held-out evaluation,
which finishes later than its round, with every metric it gave (``metrics``); a
``"kind": "failover"`` line, a coordinator replica taking over (docs/failover.md).

A link's exchange in a round against its floor (``exchange_s``, ``floor_s``, ``ratio``,
``limit``; docs/striping.md) is known only once its agent timed it, which its next
contribution reports, after the round's line was written: a ``"kind": "timing"`` line
then holds those links' figures under ``links`` and the round's ``floor_s`` (its slowest
timed link's, those of the round's line included). A reader folds a round's timing lines
into its round line (:func:`rounds`). A restarted coordinator appends; a round closed again
after a restart has a second round line, and the latest wins.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

from skyfed.coordinator.evaluate import EvalResult
from skyfed.files import private_opener

ROUNDS_FILE = "rounds.jsonl"
LINK_FIELDS = ("codec", "state", "rtt_ms", "jitter_ms", "loss_pct", "goodput_mbit", "streams")
# Session totals a line holds as their increase since the previous round, in bytes.
COUNTERS = ("bytes_up", "bytes_down", "raw_bytes_up", "raw_bytes_down")
EFFICIENCY_FIELDS = ("exchange_s", "floor_s", "ratio", "limit")
"""What a link's line takes from its efficiency in the round (``RoundStats.links``)."""
KEEP_LINES = 16
"""Recent round lines kept to be written again when their links' timings arrive (one
round late, so a few suffice)."""


class RunHistory:
    """Appends to ``path``; a restarted coordinator appends to the same file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._totals: dict[tuple[str, str], int] = {}  # (agent, counter) -> last total seen
        self._lines: dict[int, dict[str, Any]] = {}  # round -> its line as last written
        self._lock = threading.Lock()  # rounds come from the observer, evaluations from a worker

    def round(self, record: dict[str, Any], agents: list[dict[str, Any]]) -> dict[str, Any]:
        """Append one closed round with the links' state as ``agents`` show it now, and
        their efficiencies in it that are known (``record["links"]``)."""
        timed = record.get("links", [])
        record = dict(record)
        reported: dict[str, dict[str, float]] = record.pop("metrics", {})
        links = {a["name"]: self._link(a, reported.get(a["name"])) for a in agents}
        line = _with_efficiency({"kind": "round", **record, "links": links}, timed)
        with self._lock:
            self._lines[int(record["round"])] = line
            for old in sorted(self._lines)[:-KEEP_LINES]:
                del self._lines[old]
        self._append(line)
        return line

    def timed(self, round_: int, efficiencies: list[dict[str, Any]]) -> None:
        """Append a timing line for round ``round_``: its links' ``efficiencies`` (the
        round's ``RoundStats.links`` as data), which arrived after its line was written."""
        with self._lock:
            line = self._lines.get(round_)
            if line is None:
                return  # older than the lines kept: its round line stands alone
            line = self._lines[round_] = _with_efficiency(line, efficiencies)
        timed = {e["name"] for e in efficiencies}
        links = {
            name: {k: link[k] for k in EFFICIENCY_FIELDS if k in link}
            for name, link in line["links"].items()
            if name in timed
        }
        record: dict[str, Any] = {"kind": "timing", "round": round_, "links": links}
        if "floor_s" in line:
            record["floor_s"] = line["floor_s"]
        self._append(record)

    def eval(self, result: EvalResult, wall_s: float) -> None:
        self._append(
            {
                "kind": "eval",
                "round": result.round,
                "eval_loss": result.loss,
                "eval_s": result.seconds,
                "wall_s": wall_s,
                "metrics": result.metrics,
            }
        )

    def failover(self, record: dict[str, Any]) -> None:
        """A coordinator replica took over (``Failover`` as data, with its ``wall_s``): a
        ``"kind": "failover"`` line the report marks on its time axes."""
        self._append({"kind": "failover", **record})

    def close(self) -> None:
        """Every line is flushed as written; nothing to do."""

    def _link(self, agent: dict[str, Any], metrics: dict[str, float] | None) -> dict[str, Any]:
        """``metrics``: what the agent's contribution to the round carried (None: nothing)."""
        link = {k: agent[k] for k in LINK_FIELDS if k in agent}
        if metrics:
            link["metrics"] = dict(metrics)
        for key in COUNTERS:
            total = int(agent.get(key, 0))
            last = self._totals.get((agent["name"], key), 0)
            # A new session counts from zero again: all of its bytes are new.
            link[key] = total - last if total >= last else total
            self._totals[(agent["name"], key)] = total
        return link

    def _append(self, line: dict[str, Any]) -> None:
        text = json.dumps(line, default=str) + "\n"
        with self._lock, open(self.path, "a", opener=private_opener) as f:
            f.write(text)


def _with_efficiency(line: dict[str, Any], efficiencies: list[dict[str, Any]]) -> dict[str, Any]:
    """``line`` with each timed link's exchange, floor and ratio under its name, and the
    round's floor: its slowest link's (the round waits for every link), in seconds."""
    links = {name: dict(link) for name, link in line["links"].items()}
    for e in efficiencies:
        link = links.setdefault(e["name"], {})
        link.update({k: e[k] for k in EFFICIENCY_FIELDS if k in e})
    floors = [float(x["floor_s"]) for x in links.values() if "floor_s" in x]
    floors = [f for f in floors if math.isfinite(f)]
    line = {**line, "links": links}
    if floors:
        line["floor_s"] = max(floors)
    return line


def rounds(lines: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each round's line, by round, with its timing lines folded in (a round's latest
    round line wins, as after a restart; a timing line adds to the round line before it)."""
    out: dict[int, dict[str, Any]] = {}
    for line in lines:
        kind, r = line.get("kind"), int(line.get("round", -1))
        if kind == "round":
            out[r] = line
        elif kind == "timing" and r in out:
            merged = {n: {**link} for n, link in out[r].get("links", {}).items()}
            for name, figures in line.get("links", {}).items():
                merged.setdefault(name, {}).update(figures)
            out[r] = {**out[r], "links": merged}
            if "floor_s" in line:
                out[r]["floor_s"] = line["floor_s"]
    return out


def read(path: Path) -> list[dict[str, Any]]:
    """Every line of a history file; a torn last line (a kill mid-write) is skipped."""
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return lines

"""Where a round's time goes: the ``[*.Phase]`` DEBUG lines of a run's logs, as a table.

The coordinator and every agent log wall-clock marks of each round's phases at DEBUG
(``skyfed.logs.Phases``); on one host their clocks agree, so one round's marks line up
across processes. A round (as the coordinator times it: open to close, the next opening
at the close) is a chain, and its critical path runs through the agent whose contribution
commits last:

- ``last round's apply + digest``: the round opens when the last round's chunks and
  round ends are queued (and the coordinator's status is written); the critical agent
  receives what is still in flight (on a WAN, most of the broadcast), applies it (decode
  into the weights) and hashes its weights before it starts training (on loopback with
  a small model it may start before the opening: a few ms below zero);
- ``training``: its local steps (the figure it reports as ``train_s``);
- ``encode``: its uplink encode, chunks queued as payloads come (``encode_s`` of it is the
  codec itself; the rest is cutting and queueing chunks);
- ``upload + check``: from its last chunk queued to its contribution committed on the
  coordinator (the wire, and the coordinator's check of each payload);
- ``close``: from the last commit to the broadcast queued: the mean (decoding every
  contribution into the update, the outer step), the downlink encode with its error
  feedback, the weights' update, chunks serialized and queued;
- ``checkpoint + round ends``: the checkpoint's wait and each session's round end.

In an overlapped round (``overlap = true``) the agent marks its local steps for the round
they contribute to, and they begin while the round before is still in flight: the first
segment is then negative (training began that long before the opening), and ``encode``
holds the wait for the round before's aggregate, its apply and the encode. The segments
still add up to the round.

``bench/scale.py --phases`` and ``bench/wan.py --phases`` print it.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PHASE = re.compile(
    r"\[(?P<who>Agent|Coordinator)\.Phase\] round=(?P<round>\d+) (?P<name>\w+) "
    r"at=(?P<at>[\d.]+)(?P<rest>.*)$"
)
FIGURE = re.compile(r" (\w+)=(\S+)")
COORDINATOR = "coordinator"


@dataclass(slots=True)
class Marks:
    """One process's marks: (round, name) -> unix s, and figures that came with them."""

    at: dict[tuple[int, str], float] = field(default_factory=dict)
    figures: dict[tuple[int, str], dict[str, str]] = field(default_factory=dict)
    committed: dict[tuple[int, str], float] = field(default_factory=dict)
    """Coordinator only: (round, agent key) -> when its contribution committed."""


def read(text: str) -> Marks:
    """The phase marks in one process's log (the first of each name per round)."""
    marks = Marks()
    for line in text.splitlines():
        m = PHASE.search(line)
        if m is None:
            continue
        r, name, at = int(m["round"]), m["name"], float(m["at"])
        figures = dict(FIGURE.findall(m["rest"]))
        if name == "committed":
            marks.committed.setdefault((r, figures.get("agent", "")), at)
            continue
        marks.at.setdefault((r, name), at)
        marks.figures.setdefault((r, name), figures)
    return marks


SEGMENTS = (
    "last round's apply + digest",
    "training",
    "encode",
    "upload + check",
    "close",
    "checkpoint + round ends",
)
"""The critical path of a round, open to round ends, in order: they add up to it."""
DETAIL = (
    "close -> first aggregate chunk at an agent",
    "agent: round end -> applied (decode into weights)",
    "agent: digest (its wait)",
    "agent: encode_s (the codec)",
    "coordinator: mean + outer step",
    "coordinator: downlink encode + apply to weights",
    "coordinator: chunks queued, weights hashed",
    "coordinator: round ends -> next open (status written)",
    "training skew (slowest - critical)",
)
"""Parts of the segments (agent figures: medians over the agents)."""


@dataclass(slots=True)
class Breakdown:
    """Per round (after the first): each segment's seconds on the critical path."""

    rounds: list[int] = field(default_factory=list)
    segments: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    duration: list[float] = field(default_factory=list)
    critical: list[str] = field(default_factory=list)


def breakdown(logs: dict[str, str], agents: Iterable[str]) -> Breakdown:
    """The critical path of every round with all its marks, from the processes' logs
    (name -> text; agent names as the coordinator's keys end, ``.../aws-1``)."""
    coord = read(logs[COORDINATOR])
    marks = {a: read(logs[a]).at for a in agents}
    c = coord.at
    out = Breakdown()
    for r in sorted({r for r, n in c if n == "open"}):
        commits = {
            a: t
            for (rr, key), t in coord.committed.items()
            if rr == r
            for a in marks
            if key.endswith("/" + a) or key == a
        }
        names = ("open", "close", "encoded", "ended")
        if r == 0 or len(commits) != len(marks) or any((r, n) not in c for n in names):
            continue
        if (r - 1, "ended") not in c or (r + 1, "open") not in c:
            continue
        per_agent = ("train_begin", "train_end", "sent", "aggregate_begin", "round_end")
        if any(
            (r, n) not in m for m in marks.values() for n in (*per_agent, "applied", "digested")
        ):
            continue
        crit = max(commits, key=commits.__getitem__)
        m = marks[crit]
        seg = out.segments
        seg["last round's apply + digest"].append(m[(r, "train_begin")] - c[(r, "open")])
        seg["training"].append(m[(r, "train_end")] - m[(r, "train_begin")])
        seg["encode"].append(m[(r, "sent")] - m[(r, "train_end")])
        seg["upload + check"].append(commits[crit] - m[(r, "sent")])
        seg["close"].append(c[(r, "encoded")] - commits[crit])
        seg["checkpoint + round ends"].append(c[(r, "ended")] - c[(r, "encoded")])
        agents_ = marks.values()
        seg[DETAIL[0]].append(min(a[(r, "aggregate_begin")] for a in agents_) - c[(r, "close")])
        seg[DETAIL[1]].append(
            statistics.median(a[(r, "applied")] - a[(r, "round_end")] for a in agents_)
        )
        seg[DETAIL[2]].append(statistics.median(_digest_wait(logs, a, r) for a in marks))
        encodes = [read(logs[a]).figures[(r, "sent")].get("encode_s", "nan") for a in marks]
        seg[DETAIL[3]].append(statistics.median(float(e) for e in encodes))
        closing = coord.figures[(r, "encoded")]
        mean_s, encode_s = float(closing["mean_s"]), float(closing["encode_s"])
        seg[DETAIL[4]].append(mean_s)
        seg[DETAIL[5]].append(encode_s - mean_s)
        seg[DETAIL[6]].append(c[(r, "encoded")] - c[(r, "close")] - encode_s)
        seg[DETAIL[7]].append(c[(r + 1, "open")] - c[(r, "ended")])
        trains = [a[(r, "train_end")] - a[(r, "train_begin")] for a in agents_]
        seg[DETAIL[8]].append(max(trains) - seg["training"][-1])
        out.duration.append(c[(r, "ended")] - c[(r, "open")])
        out.rounds.append(r)
        out.critical.append(crit)
    return out


def _digest_wait(logs: dict[str, str], agent: str, r: int) -> float:
    """How long ``agent`` waited for its weights' digest after round ``r``'s aggregate:
    the figure its check logs (the check may come after the next local steps), or, from
    an agent that checks at once, applied to digested."""
    m = read(logs[agent])
    wait = m.figures[(r, "digested")].get("wait_s")
    return float(wait) if wait is not None else m.at[(r, "digested")] - m.at[(r, "applied")]


def table(b: Breakdown, title: str) -> list[str]:
    """Medians over the rounds, ms, the segments first (they add up to the round) and
    then the details inside them."""
    if not b.rounds:
        return [f"{title}: no round with every phase mark (was the run at DEBUG?)"]
    med = {k: statistics.median(v) * 1000 for k, v in b.segments.items()}
    lines = [
        f"{title}: critical path, medians over rounds {b.rounds[0]}..{b.rounds[-1]} "
        f"(critical agents: {', '.join(sorted(set(b.critical)))})",
        "",
        "| segment | ms |",
        "|---|---|",
    ]
    lines += [f"| {s} | {med[s]:.0f} |" for s in SEGMENTS]
    lines.append(f"| **round (open to round ends)** | {statistics.median(b.duration) * 1000:.0f} |")
    lines += [f"| of which, {s} | {med[s]:.0f} |" for s in DETAIL]
    return lines


def from_dir(log_dir: Path, agents: Iterable[str]) -> Breakdown:
    """:func:`breakdown` of the ``<name>.log`` files in ``log_dir``."""
    names = [COORDINATOR, *agents]
    return breakdown({n: (log_dir / f"{n}.log").read_text() for n in names}, agents)

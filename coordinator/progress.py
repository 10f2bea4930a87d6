"""What ``coordinator serve`` shows a person while it runs: a live view on a terminal
(round N of M, ETA, why it waits, the agents table), plain log lines otherwise."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import grpc
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from skyfed.coordinator.admin import agents_table
from skyfed.coordinator.snapshot import waiting_for

REFRESH_S = 0.5
ETA_ROUNDS = 10  # the ETA uses the mean duration of the last this many rounds


def headline(snap: dict[str, Any]) -> str:
    """``round 12 of 30 · 1.4 s/round · ETA 0:25 · held-out 2.31`` or why it waits."""
    why = waiting_for(snap)
    if why:
        return why
    planned, rounds = int(snap.get("rounds_planned", 0)), snap["rounds"]
    done = rounds[-1]["round"] + 1 if rounds else int(snap["round"])
    parts = [f"round {done} of {planned}" if planned else f"round {done}"]
    recent = rounds[-ETA_ROUNDS:]
    if recent:
        per_round = sum(r["duration_s"] for r in recent) / len(recent)
        parts.append(f"{per_round:.2f} s/round")
        if planned:
            parts.append(f"ETA {_clock(per_round * max(0, planned - done))}")
        parts.append(f"loss {rounds[-1]['mean_loss']:.3f}")
    if snap.get("eval_round", -1) >= 0:
        parts.append(f"held-out {snap['eval_loss']:.3f} (round {snap['eval_round']})")
    if snap.get("finished"):
        parts.append("finished")
    return " · ".join(parts)


def _clock(seconds: float) -> str:
    minutes, s = divmod(int(seconds + 0.5), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{s:02d}" if minutes >= 60 else f"{minutes}:{s:02d}"


class LiveView:
    """Redraws ``snapshot()`` until :meth:`close`; while it runs, only warnings are logged
    to the terminal (the view shows the rest)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], console: Console) -> None:
        self._snapshot = snapshot
        self._console = console
        self._stop = threading.Event()
        self._live = Live(console=console, refresh_per_second=4, transient=False)
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._quiet = [(h, h.level) for h in logging.getLogger().handlers]

    def start(self) -> LiveView:
        for handler, _ in self._quiet:
            handler.setLevel(logging.WARNING)
        self._live.start()
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._draw()
        self._live.stop()
        for handler, level in self._quiet:
            handler.setLevel(level)

    def _run(self) -> None:
        while not self._stop.wait(REFRESH_S):
            self._draw()

    def _draw(self) -> None:
        snap = self._snapshot()
        self._live.update(Group(Text(headline(snap), style="bold"), agents_table(snap)))


class WatchLoop:
    """``coordinator status --watch``: redraw a fetched snapshot every ``interval_s``."""

    def __init__(self, fetch: Callable[[], dict[str, Any]], interval_s: float) -> None:
        self.fetch, self.interval_s = fetch, interval_s

    def run(self, console: Console, stop: threading.Event) -> None:
        with Live(console=console, refresh_per_second=4) as live:
            while not stop.is_set():
                try:
                    snap = self.fetch()
                    live.update(Group(Text(headline(snap), style="bold"), agents_table(snap)))
                except grpc.RpcError as exc:  # a restarting coordinator: keep watching
                    live.update(Text(f"no status: {exc.code().name} {exc.details()}", style="red"))
                stop.wait(self.interval_s)

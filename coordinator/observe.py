"""Watching a running federation from beside its round engine: the status snapshot for
exporters and the CLI, the run history, held-out evaluation, TensorBoard.

One thread, woken by every closed round (and every half second), reads the federation's
status and hands each newly closed round to the sinks; nothing here runs on a round's
critical path.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from skyfed.coordinator import runinfo
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.evaluate import EvalResult, Evaluator
from skyfed.coordinator.federation import Federation
from skyfed.coordinator.history import ROUNDS_FILE, RunHistory
from skyfed.coordinator.snapshot import to_data, waiting_for
from skyfed.tasks import load_task

log = logging.getLogger(__name__)

POLL_S = 0.5  # between rounds: only for the waiting line


class Sink(Protocol):
    """Where closed rounds and evaluations go (the history file, TensorBoard)."""

    def round(self, record: dict[str, Any], agents: list[dict[str, Any]]) -> Any: ...

    def timed(self, round_: int, efficiencies: list[dict[str, Any]]) -> None:
        """Links' efficiencies in an already closed round (its agents time an exchange in
        their next contribution), only those not handed over before."""

    def eval(self, result: EvalResult, wall_s: float) -> None: ...

    def failover(self, record: dict[str, Any]) -> None:
        """A coordinator replica took over the federation (docs/failover.md)."""

    def close(self) -> None: ...


class Observer:
    """Watches ``federation`` on its own thread from :meth:`start` to :meth:`close`."""

    def __init__(self, federation: Federation, config: CoordinatorConfig) -> None:
        self.federation = federation
        self.config = config
        self.sinks: list[Sink] = []
        if config.metrics.run_dir is not None:
            runinfo.write(config.metrics.run_dir, config)
            self.sinks.append(RunHistory(config.metrics.run_dir / ROUNDS_FILE))
        if config.metrics.tensorboard is not None:
            from skyfed.coordinator.tensorboard import TensorBoardSink

            self.sinks.append(TensorBoardSink(config.metrics.tensorboard))
        self.evaluator = Evaluator(
            load_task(config.task), config.metrics.eval_every, self._evaluated
        )
        self._last_round = -1
        self._timed: dict[int, int] = {}  # round -> its RoundStats.links handed over so far
        self._waiting = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="observer", daemon=True)

    def start(self) -> Observer:
        self._thread.start()
        return self

    def snapshot(self) -> dict[str, Any]:
        """The status as plain data, plus the task's name (``skyfed.metrics.coordinator``)."""
        snap = to_data(self.federation.status(departed=True))
        snap["task"] = self.config.task
        return snap

    def close(self, eval_timeout_s: float = 60.0) -> None:
        """Stop polling; hand over the last rounds and a final evaluation, then the sinks."""
        self._stop.set()
        self.federation.rounds.round_closed.set()  # else the thread sleeps out its POLL_S first
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.evaluator.join(eval_timeout_s)  # free the worker for the final round
        self.poll(final=True)
        self.evaluator.join(eval_timeout_s)
        for sink in self.sinks:
            sink.close()

    def poll(self, final: bool = False) -> dict[str, Any]:
        snap = self.snapshot()
        self._say_why_waiting(snap)
        for r in snap["rounds"]:
            links = r.get("links", [])
            if r["round"] > self._last_round:
                self._last_round = r["round"]
                record = _record(r)
                for sink in self.sinks:
                    sink.round(record, snap["agents"])
            elif r["round"] in self._timed and len(links) > self._timed[r["round"]]:
                for sink in self.sinks:
                    sink.timed(r["round"], links[self._timed[r["round"]] :])
            else:
                continue
            self._timed[r["round"]] = len(links)
        kept = {r["round"] for r in snap["rounds"]}
        self._timed = {k: n for k, n in self._timed.items() if k in kept}
        done = final or snap["finished"]
        if self._last_round >= 0 and self.evaluator.due(self._last_round, final=done):
            rounds = self.federation.rounds
            round_, weights = rounds.lend_weights()
            self.evaluator.submit(round_, weights, rounds.weights_free.set)
        return snap

    def failover(self, record: dict[str, Any]) -> None:
        """This replica took over from another (its ``Failover`` as data, with its
        ``wall_s``): the run's history marks it."""
        for sink in self.sinks:
            sink.failover(record)

    def _run(self) -> None:
        closed = self.federation.rounds.round_closed
        while not self._stop.is_set():
            closed.wait(POLL_S)  # woken by each closed round; else polls for the waiting line
            closed.clear()
            try:
                self.poll()
            except Exception:  # an observer must never stop the federation
                log.exception("[Coordinator.Observe] poll failed")

    def _evaluated(self, result: EvalResult) -> None:
        fed = self.federation
        wall_s = time.monotonic() - fed.started_at
        with fed.cond:
            fed.evaluation = result
        for sink in self.sinks:
            sink.eval(result, wall_s)

    def _say_why_waiting(self, snap: dict[str, Any]) -> None:
        why = waiting_for(snap)
        if why and why != self._waiting:
            log.info("[Coordinator.Wait] %s", why)
        self._waiting = why


def _record(r: dict[str, Any]) -> dict[str, Any]:
    """A history line's figures for closed round ``r``."""
    record = {k: v for k, v in r.items() if k != "opened_at"}  # monotonic: meaningless later
    return {**record, "exchange_s": max(0.0, r["duration_s"] - r["train_s"])}

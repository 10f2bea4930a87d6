"""Watching an agent from beside its session loop: the snapshot its exporter reads, the
side port, and a line per applied round for the person who started it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client.registry import CollectorRegistry

from skyfed.agent.config import AgentConfig
from skyfed.metrics.agent import AgentCollector
from skyfed.metrics.http import MetricsServer

POLL_S = 0.2
# Between applied rounds, a line at most this often while the local phase goes on: a
# phase of hundreds of steps takes minutes, silent otherwise (docs/outer-optimizer.md).
PHASE_LINE_S = 30.0


def snapshot(agent: Any, config: AgentConfig) -> dict[str, Any]:
    """The agent's state as plain data (see ``skyfed.metrics.agent``)."""
    return {
        "name": config.name,
        "cloud": config.cloud,
        "connected": agent.connected,
        "round": agent.last_round,
        "rounds_applied": agent.applied,
        "loss": agent.last_loss,
        "bytes_up": agent.bytes_up,
        "bytes_down": agent.bytes_down,
        "codec": agent.codec,
        "dp": agent.site.layout[0],
        "tp": agent.site.layout[1],
        "gpus": agent.site.gpus.as_list(),
        "metrics": dict(agent.metrics),
    }


def start_metrics(agent: Any, config: AgentConfig) -> MetricsServer | None:
    """``/metrics``, ``/healthz`` and ``/readyz`` (ready = in a session), if configured."""
    if not config.metrics_listen:
        return None
    registry = CollectorRegistry()
    registry.register(AgentCollector(lambda: snapshot(agent, config)))

    def ready() -> tuple[bool, str]:
        return (True, "") if agent.connected else (False, "not in a session")

    return MetricsServer(config.metrics_listen, registry, ready, public=config.metrics_public)


def start_node_probes(config: AgentConfig, joined: Callable[[], bool]) -> MetricsServer | None:
    """On a node of a multi-node site other than the leader's, its first rank serves
    ``/healthz`` and ``/readyz`` (ready = its ranks joined the site) on the same port, so
    every pod of the site passes its probes; the site's metrics, GPUs included, are the
    leader's (``skyfed.agent.gpus``)."""
    if not config.metrics_listen:
        return None

    def ready() -> tuple[bool, str]:
        return (True, "") if joined() else (False, "the site's ranks have not joined")

    return MetricsServer(
        config.metrics_listen, CollectorRegistry(), ready, public=config.metrics_public
    )


class RoundLines:
    """Calls ``say`` with one line per round the agent applies, and one every
    ``phase_line_s`` while a long local phase goes on, until :meth:`close`."""

    def __init__(
        self,
        agent: Any,
        config: AgentConfig,
        say: Callable[[str], None],
        phase_line_s: float = PHASE_LINE_S,
    ) -> None:
        self._agent, self._config, self._say = agent, config, say
        self._phase_line_s = phase_line_s
        self._said_at = time.monotonic()
        self._seen = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="round-lines", daemon=True)

    def start(self) -> RoundLines:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._tick()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self._tick()

    def _tick(self) -> None:
        s = snapshot(self._agent, self._config)
        if s["rounds_applied"] == self._seen:
            self._phase_line(s)
            return
        self._seen = s["rounds_applied"]
        self._said_at = time.monotonic()
        if s["round"] < 0:
            return
        rounds = f" of {self._config.rounds}" if self._config.rounds else ""
        self._say(
            f"{s['name']}: round {s['round']}{rounds} applied · loss {s['loss']:.3f} · "
            f"codec {s['codec'].split(':', 1)[0]} · up {s['bytes_up'] / 1e6:.1f} MB · "
            f"down {s['bytes_down'] / 1e6:.1f} MB"
        )

    def _phase_line(self, s: dict[str, Any]) -> None:
        """The local phase's progress, if nothing was said for ``phase_line_s``."""
        trainer = self._agent.site.trainer
        if time.monotonic() - self._said_at < self._phase_line_s or not trainer.local_step:
            return
        self._said_at = time.monotonic()
        self._say(
            f"{s['name']}: round {s['round'] + 1} · local step {trainer.local_step} of "
            f"{trainer.local_steps}"
        )

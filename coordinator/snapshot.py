"""The status built from the federation, and as plain data (dicts, lists, numbers) for
exporters, the history and the CLI: what they read is JSON-shaped, so a new status field
reaches them without an edit here."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from skyfed.compression.monitor import Window
from skyfed.status import AgentStatus, Status

if TYPE_CHECKING:
    from skyfed.coordinator.federation import Federation
    from skyfed.coordinator.session import Session


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


def build_status(fed: Federation, windows: bool = False, departed: bool = False) -> Status:
    """A snapshot of ``fed``; the caller holds its lock. ``windows`` adds raw link samples,
    ``departed`` the last round's members that have left since (``Federation.status``)."""
    now = time.monotonic()
    sessions, revoked = fed.admission.sessions, fed.admission.revoked
    down = fed.admission.down
    rounds = fed.rounds
    gone = [
        s
        for s in (rounds.closed_with if departed else ())
        if s.key not in sessions and s.key not in revoked and s.key not in down
    ]
    return Status(
        round=fed.model.round,
        agents=[_agent(fed, s, now, windows) for s in sessions.values()]
        + [_agent(fed, s, now, False) for k, s in revoked.items() if k not in sessions]
        + [_agent(fed, s, now, False) for s in gone]
        + [_agent(fed, s, now, False) for k, s in down.items() if k not in sessions],
        weights_digest=fed.model.weights_digest,
        uptime_s=now - fed.started_at,
        rounds=[replace(r, links=list(r.links)) for r in rounds.history],
        finished=rounds.finished,
        exchange=fed.config.rounds.exchange,
        rounds_planned=fed.config.rounds.rounds,
        min_agents=fed.config.rounds.min_agents,
        refusals=dict(fed.refusals),
        checkpoints=rounds.checkpoints_written,
        checkpoint_s=rounds.checkpoint_wait_s,
        eval_round=fed.evaluation.round if fed.evaluation else -1,
        eval_loss=fed.evaluation.loss if fed.evaluation else 0.0,
        eval_metrics=dict(fed.evaluation.metrics) if fed.evaluation else {},
    )


def _agent(fed: Federation, s: Session, now: float, windows: bool) -> AgentStatus:
    return AgentStatus(
        cloud=s.identity.cloud or "",
        name=s.identity.name,
        state=s.state,
        last_round=s.last_round,
        codec=s.codec,
        rtt_ms=s.rtt_ms,
        bytes_up=s.bytes_up,
        bytes_down=s.bytes_down,
        connected_s=now - s.joined_at,
        codec_switches=s.codec_switches,
        refused=s.refused,
        loss_pct=s.loss_pct,
        jitter_ms=s.jitter_ms,
        goodput_mbit=s.goodput_mbit,
        windows=_windows(fed, s) if windows else [],
        raw_bytes_up=s.raw_bytes_up,
        raw_bytes_down=s.raw_bytes_down,
        streams=s.connections,
        stream_switches=s.stream_switches,
        efficiency=s.efficiency,
        codec_params=fed.links.codec_params(s, fed.model.round),
        local_steps=s.local_steps,
        dp=s.dp,
        tp=s.tp,
        last_error=s.last_error,
        metrics=dict(s.metrics),
        metrics_round=s.metrics_round,
    )


def _windows(fed: Federation, session: Session) -> list[Window]:
    link = fed.links.get(session)
    if link is None:
        return []
    return list(link.monitor.window_log)

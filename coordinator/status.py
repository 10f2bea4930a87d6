"""The coordinator's status as plain dataclasses: who is connected and how, recent rounds."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from skyfed.compression.monitor import Window

if TYPE_CHECKING:
    from skyfed.coordinator.federation import Federation
    from skyfed.coordinator.session import Session


@dataclass(slots=True)
class RoundStats:
    """One round's figures; the open round's are filled in as it goes."""

    round: int
    opened_at: float = 0.0
    duration_s: float = 0.0
    train_s: float = 0.0
    contributors: int = 0
    mean_loss: float = float("nan")
    bytes_up: int = 0
    bytes_down: int = 0
    raw_bytes_up: int = 0
    raw_bytes_down: int = 0
    downlink_codec: str = ""


@dataclass(frozen=True, slots=True)
class AgentStatus:
    cloud: str
    name: str
    state: str
    """syncing | idle | sending | disconnected | revoked (its certificate was revoked)."""
    last_round: int
    codec: str
    rtt_ms: float
    bytes_up: int
    bytes_down: int
    connected_s: float
    codec_switches: int
    refused: int
    loss_pct: float
    jitter_ms: float
    goodput_mbit: float
    windows: list[Window] = field(default_factory=list)
    """The link monitor's closed windows, oldest first (only when asked for)."""


@dataclass(frozen=True, slots=True)
class Status:
    """What ``Status`` answers and the status file holds (``StatusReply`` on the wire)."""

    round: int
    agents: list[AgentStatus]
    weights_digest: str
    uptime_s: float
    rounds: list[RoundStats]
    finished: bool
    exchange: str


def build_status(fed: Federation, windows: bool = False) -> Status:
    """A snapshot of ``fed``; the caller holds its lock. ``windows`` adds raw link samples."""
    now = time.monotonic()
    return Status(
        round=fed.round,
        agents=[_agent(fed, s, now, windows) for s in fed.sessions.values()]
        + [_agent(fed, s, now, False) for k, s in fed.revoked.items() if k not in fed.sessions],
        weights_digest=fed.weights_digest,
        uptime_s=now - fed.started_at,
        rounds=[replace(r) for r in fed.history],
        finished=fed.finished,
        exchange=fed.config.exchange,
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
    )


def _windows(fed: Federation, session: Session) -> list[Window]:
    link = fed.links.get(session)
    if link is None:
        return []
    return list(link.monitor.window_log)

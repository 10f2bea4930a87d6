"""How many connections each link's session stripes over: Mathis's model, confirmed by probing.

One loss-based TCP stream moves at most about ``MSS / RTT x 1.22 / sqrt(p)`` (Mathis et
al. 1997), whatever the path's rate: at 120 ms and 0.5 % loss, 1.7 Mbit/s. N streams
move N times that until the path itself is full. After each upload the policy compares
the goodput each of the link's N streams achieved with that cap: streams near it are
loss-limited, so it tries twice as many, and keeps them only if the link's goodput grew
(a path that is already full, or a limit elsewhere, shows no growth); streams far below
it have another limit, so it tries half as many and keeps them if goodput held. The N
changes at a round boundary, as a codec switch does (``docs/striping.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from skyfed.validate import require

MATHIS_C = math.sqrt(1.5)
"""Mathis's constant for periodic loss with delayed ACKs off (1.22)."""


@dataclass(kw_only=True, slots=True)
class StreamsConfig:
    """Bounds and thresholds of the choice of N. TOML: ``[streams]``."""

    max_streams: int = 16
    """Most TCP connections one agent's session may stripe its chunks over (1: never
    stripe, every session is one plain stream). On the cross-region lab link 16 moved 3.5x
    one stream's goodput and 32 no more than 16 (docs/striping.md)."""
    min_streams: int = 1
    """Fewest connections a striping session runs on, and where a new link starts
    (``min_streams = max_streams`` fixes N)."""
    grow_pct: float = 15.0
    """A probe to more streams is kept only if the link's goodput grew by at least this
    much; a probe to fewer is kept if it fell by less."""
    loss_limited_frac: float = 0.5
    """Streams count as loss-limited when each moves at least this fraction of its
    Mathis cap: more of them should help."""
    idle_frac: float = 0.1
    """Streams moving less than this fraction of their Mathis cap are limited elsewhere
    (the path's rate, a window, the codec): fewer should do."""
    hold_transfers: int = 4
    """After a probe that did not pay, uploads to wait before probing again."""
    mss_bytes: int = 1448
    """TCP segment payload the model assumes (1500-byte MTU, IPv4, timestamps)."""

    def __post_init__(self) -> None:
        require("streams", 1 <= self.max_streams <= 64, "max_streams", self.max_streams, "in 1..64")
        least = self.min_streams
        require(
            "streams", 1 <= least <= self.max_streams, "min_streams", least, "in 1..max_streams"
        )
        require("streams", 0 < self.grow_pct < 100, "grow_pct", self.grow_pct, "in (0, 100)")
        frac, idle = self.loss_limited_frac, self.idle_frac
        require("streams", 0 < frac <= 1, "loss_limited_frac", frac, "in (0, 1]")
        require("streams", 0 <= idle < frac, "idle_frac", idle, "in [0, loss_limited_frac)")
        require("streams", self.hold_transfers >= 0, "hold_transfers", self.hold_transfers, ">= 0")
        require(
            "streams", 500 <= self.mss_bytes <= 9000, "mss_bytes", self.mss_bytes, "in 500..9000"
        )


@dataclass(frozen=True, slots=True)
class StreamsState:
    """Where one link stands: its N, and the probe in progress if any."""

    streams: int = 1
    probe_from: int = 0
    """The N the current probe left (0: not probing)."""
    probe_from_mbit: float = math.nan
    """The link's goodput at ``probe_from``."""
    hold: int = 0
    """Uploads left before the next probe."""


@dataclass(frozen=True, slots=True)
class Decision:
    """A step of the policy: the link's next state, and the figures that chose it (logged)."""

    state: StreamsState
    goodput_mbit: float
    cap_mbit: float
    """Mathis's cap for one stream at the link's RTT and loss (inf without loss)."""
    reason: str


def mathis_mbit(rtt_ms: float, loss_pct: float, mss_bytes: int = 1448) -> float:
    """The most one loss-based TCP stream moves at ``rtt_ms`` and ``loss_pct`` one-way
    loss, in Mbit/s; inf without loss (a window or the path limits it, not loss), nan
    while RTT is unknown."""
    if not (math.isfinite(rtt_ms) and rtt_ms > 0):
        return math.nan
    p = loss_pct / 100 if math.isfinite(loss_pct) else 0.0
    if p <= 0:
        return math.inf
    return mss_bytes * 8 / (rtt_ms / 1000) * MATHIS_C / math.sqrt(p) / 1e6


def streams_for(goodput_mbit: float, rtt_ms: float, loss_pct: float, mss_bytes: int = 1448) -> int:
    """Streams the model says ``goodput_mbit`` needs at this RTT and loss (at least 1)."""
    cap = mathis_mbit(rtt_ms, loss_pct, mss_bytes)
    if not (math.isfinite(cap) and cap > 0 and goodput_mbit > 0):
        return 1
    return max(1, math.ceil(goodput_mbit / cap))


def step(
    state: StreamsState,
    goodput_mbit: float,
    rtt_ms: float,
    loss_pct: float,
    config: StreamsConfig,
) -> Decision:
    """One upload's step: ``goodput_mbit`` is what the link moved over ``state.streams``
    streams, at the link's current ``rtt_ms`` and ``loss_pct``."""
    cap = mathis_mbit(rtt_ms, loss_pct, config.mss_bytes)
    n, grow = state.streams, 1 + config.grow_pct / 100

    def decide(next_: StreamsState, reason: str) -> Decision:
        return Decision(next_, goodput_mbit, cap, reason)

    if not (goodput_mbit > 0 and math.isfinite(goodput_mbit)) or math.isnan(cap):
        return decide(state, "nothing measured")
    if state.probe_from:
        base, base_mbit = state.probe_from, state.probe_from_mbit
        up = n > base
        paid = goodput_mbit >= base_mbit * grow if up else goodput_mbit * grow > base_mbit
        if not paid:
            held = StreamsState(streams=base, hold=config.hold_transfers)
            return decide(
                held,
                f"{n} streams moved {goodput_mbit:.1f} Mbit/s against {base_mbit:.1f} at {base}",
            )
        state = StreamsState(streams=n)
        if not up:
            return decide(state, f"{n} streams hold {goodput_mbit:.1f} Mbit/s as {base} did")
    if state.hold:
        return decide(replace(state, hold=state.hold - 1), "holding after a probe")
    each = goodput_mbit / n
    if n < config.max_streams and each >= config.loss_limited_frac * cap:
        to = min(config.max_streams, 2 * n)
        probe = StreamsState(streams=to, probe_from=n, probe_from_mbit=goodput_mbit)
        return decide(probe, f"each stream moves {each:.2f} of its {cap:.2f} Mbit/s cap")
    if n > config.min_streams and each < config.idle_frac * cap:
        to = max(config.min_streams, n // 2)
        probe = StreamsState(streams=to, probe_from=n, probe_from_mbit=goodput_mbit)
        return decide(probe, f"each stream moves {each:.2f} of its {cap:.2f} Mbit/s cap")
    return decide(state, "steady")

"""How many connections each link's session stripes over: Mathis's model, confirmed by probing.

One loss-based TCP stream moves at most about ``MSS / RTT x 1.22 / sqrt(p)`` (Mathis et
al. 1997), whatever the path's rate: at 120 ms and 0.5 % loss, 1.7 Mbit/s. N streams
move N times that until the path itself is full. After each upload the policy compares
the goodput each of the link's N streams achieved with that cap. Streams near it are
loss-limited: where the operator gave the link's rate, the policy tries at once the N the
model says fills it (``ceil(rate / cap)``); without a rate, 4 N when the streams move
their whole cap, 2 N when half of it. Where both ends' congestion control does not back
off on random loss (BBR, as the agent's hello and our route say), the cap binds nothing
and the link is read as one without measured loss: on transpacific a warm BBR stream moved
38-44 Mbit/s of 50, 4 and 16 streams no more, and every probe's way back cost rounds (the
stream left alone moved 22-34 Mbit/s for two rounds). Where an end is loss-based or does
not say, streams far beyond their cap count as loss-limited, as a probe that does not pay
comes back. Below a known rate with no loss measured (yet), windows or
slow start hold the streams back (or the loss is not seen yet), which more streams
share out too: the N that carries the rate at the streams' goodput. A probe up is
judged on the upload after its first (new connections spend theirs on TLS, the join and
slow start) and kept only if the link's goodput grew (a full path, or a limit elsewhere, shows no
growth), and from a kept probe the policy probes again; a probe that did not pay goes
back, holds, and the next one tries half-way to the N that failed. Streams far below
their cap have another limit, so it tries half as many and keeps them if goodput held.
The N changes at a round boundary, as a codec switch does (``docs/striping.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from skyfed.config.checks import check_types, require
from skyfed.netinfo import MSS_BYTES, mathis_mbit


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
    warmup_transfers: int = 1
    """Uploads at a probe's larger N that do not judge it: its new connections spend
    their first round trips on TLS, the join and slow start (on cross-region, 4 new
    streams' first upload moved what 4 old ones did, their second 2x). A new link's first
    uploads start no probe either, for the same reason."""
    jump_factor: int = 4
    """A probe's N times the current one when each stream moves at least its whole Mathis
    cap (clearly loss-limited) and the link's rate is not known; 2 between
    ``loss_limited_frac`` and the whole cap."""
    full_frac: float = 0.8
    """Goodput at this fraction of the link's known rate (``link_rate_mbit``) fills the
    path: no more streams. Below it, on a link without measured loss, windows or slow
    start hold the streams back (or loss not seen yet), and the policy tries the N that
    would carry the rate at the streams' goodput."""
    mss_bytes: int = MSS_BYTES
    """TCP segment payload the model assumes (1500-byte MTU, IPv4, timestamps)."""
    min_transfer_rtts: float = 8.0
    """An upload shorter than this many round trips probes no more streams: Mathis's
    model is TCP's steady state, and a transfer of a few round trips is mostly slow
    start (from an initial window of 10 segments, 8 round trips reach 2500 segments, a
    100 Mbit/s x 250 ms path's window). Top-k's 0.8 MB uploads took 2-4 round trips on
    the lossy lab links and its probes to 4 streams only cost them (docs/striping.md). 0:
    any upload may probe."""

    def __post_init__(self) -> None:
        check_types(self, "streams")
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
        warm = self.warmup_transfers
        require("streams", 0 <= warm <= 8, "warmup_transfers", warm, "in 0..8")
        require("streams", 2 <= self.jump_factor <= 16, "jump_factor", self.jump_factor, "in 2..16")
        require("streams", 0.5 < self.full_frac <= 1, "full_frac", self.full_frac, "in (0.5, 1]")
        require(
            "streams", 500 <= self.mss_bytes <= 9000, "mss_bytes", self.mss_bytes, "in 500..9000"
        )
        rtts = self.min_transfer_rtts
        require("streams", 0 <= rtts <= 1000, "min_transfer_rtts", rtts, "in 0..1000")


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
    failed_at: int = 0
    """The last N a probe up did not pay at (0: none yet): later probes up try half-way
    to it, and it again only from just below it."""
    warmup: int = 0
    """Uploads left before the probe in progress is judged, or, not probing, before the
    link's first step: a link starts at ``warmup_transfers`` (``Links``) because its first
    upload runs on a cold connection (TLS, slow start). Judged against that, any probe
    pays: on transpacific Top-k's first exchange took 3.5-4.7 s, later ones 1.0 s on one stream,
    so two links kept 4 streams that took 1.1-2.3 s (docs/striping.md)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """A step of the policy: the link's next state, and the figures that chose it (logged)."""

    state: StreamsState
    goodput_mbit: float
    cap_mbit: float
    """Mathis's cap for one stream at the link's RTT and loss (inf without loss)."""
    reason: str
    rtt_ms: float = math.nan
    loss_pct: float = math.nan
    rate_mbit: float = math.nan
    """The link's rate the step went by (nan: not known)."""


def step(
    state: StreamsState,
    goodput_mbit: float,
    rtt_ms: float,
    loss_pct: float,
    config: StreamsConfig,
    rate_mbit: float = math.nan,
    chunks: int = 0,
    seconds: float = math.nan,
    loss_based: bool = True,
) -> Decision:
    """One upload's step: ``goodput_mbit`` is what the link moved over ``state.streams``
    streams, at the link's current ``rtt_ms`` and ``loss_pct``; ``rate_mbit`` is the
    link's rate where the operator knows it (nan, or 0: not known); ``chunks`` what the
    upload was cut into (0: not known); ``seconds`` how long it took (nan: not known);
    ``loss_based`` False where both ends' congestion control ignores random loss (BBR):
    then Mathis's cap binds no stream, and the link is read as one without measured loss.

    A chunk travels whole on one stream, so an upload of c chunks keeps at most c streams
    busy: N never goes above c. Without that bound a sparse codec's upload of one or two
    chunks (Top-k at 10M: 0.8 MB) probed 4 and 16 streams whose cold connections only cost
    their handshakes (on transpacific N = 1 was 2x faster than the monitor's N:
    docs/striping.md)."""
    cap = mathis_mbit(rtt_ms, loss_pct if loss_based else 0.0, config.mss_bytes)
    rate = rate_mbit if math.isfinite(rate_mbit) and rate_mbit > 0 else math.nan
    n, grow = state.streams, 1 + config.grow_pct / 100
    most = config.max_streams  # the streams this upload could keep busy
    if chunks > 0:
        most = max(config.min_streams, min(most, chunks))

    def decide(next_: StreamsState, reason: str) -> Decision:
        return Decision(next_, goodput_mbit, cap, reason, rtt_ms, loss_pct, rate)

    if not (goodput_mbit > 0 and math.isfinite(goodput_mbit)) or math.isnan(cap):
        return decide(state, "nothing measured")
    if n > most:
        return decide(
            StreamsState(streams=most, failed_at=state.failed_at),
            f"an upload of {chunks} chunks keeps at most {chunks} streams busy",
        )
    if state.warmup:  # a probe's new streams, or a new link's first connection
        why = f"{n} new streams warming up" if state.probe_from else "a cold connection's upload"
        return decide(replace(state, warmup=state.warmup - 1), why)
    if state.probe_from:
        base, base_mbit = state.probe_from, state.probe_from_mbit
        up = n > base
        paid = goodput_mbit >= base_mbit * grow if up else goodput_mbit * grow > base_mbit
        if not paid:
            failed = n if up else state.failed_at
            held = StreamsState(streams=base, hold=config.hold_transfers, failed_at=failed)
            return decide(
                held,
                f"{n} streams moved {goodput_mbit:.1f} Mbit/s against {base_mbit:.1f} at {base}",
            )
        state = StreamsState(streams=n, failed_at=state.failed_at if n < state.failed_at else 0)
        if not up:
            return decide(state, f"{n} streams hold {goodput_mbit:.1f} Mbit/s as {base} did")
    if state.hold:
        return decide(replace(state, hold=state.hold - 1), "holding after a probe")
    each = goodput_mbit / n
    full = goodput_mbit >= config.full_frac * rate  # False while the rate is not known
    short = seconds * 1000 < config.min_transfer_rtts * rtt_ms  # False while not known
    if n < most and not full and not short:
        to, why = _wider(n, each, cap, goodput_mbit, rate, config, most)
        if state.failed_at and to >= state.failed_at:
            to = max(n + 1, (n + state.failed_at) // 2)  # half-way to the N that did not pay
        if to > n:
            warm = config.warmup_transfers
            probe = replace(state, streams=to, probe_from=n, probe_from_mbit=goodput_mbit)
            return decide(replace(probe, warmup=warm), why)
    # Without measured loss a known rate decides (more streams shared out a window or slow
    # start, and kept them only because they paid); the cap decides otherwise.
    windowed = math.isinf(cap) and math.isfinite(rate)
    if n > config.min_streams and each < config.idle_frac * cap and not windowed:
        to = max(config.min_streams, n // 2)
        probe = replace(state, streams=to, probe_from=n, probe_from_mbit=goodput_mbit)
        return decide(probe, f"each stream moves {each:.2f} of its {cap:.2f} Mbit/s cap")
    if full:
        return decide(state, "the path is full")
    if short and n < most:
        return decide(state, f"an upload of {seconds * 1000 / rtt_ms:.1f} round trips: slow start")
    return decide(state, "steady")


def _wider(
    n: int, each: float, cap: float, goodput: float, rate: float, config: StreamsConfig, most: int
) -> tuple[int, str]:
    """The N a probe up tries from ``n`` (``n``: none), and why; within ``most`` streams.
    ``cap``: Mathis's (inf where no loss was measured)."""
    if each >= config.loss_limited_frac * cap:
        why = f"each stream moves {each:.2f} of its {cap:.2f} Mbit/s cap"
        if math.isfinite(rate):  # Mathis's N for the whole rate (cap is finite here)
            model = math.ceil(rate / cap)
            return min(most, max(2 * n, model)), f"{why}: {rate:.0f} Mbit/s needs {model}"
        factor = config.jump_factor if each >= cap else 2
        return min(most, factor * n), why
    if math.isfinite(rate) and not math.isfinite(cap):  # and below full_frac of it
        # No loss seen yet (a few hundred probes may hold none at 0.5 %), or windows and
        # slow start: the streams that would carry the rate at this stream's goodput.
        model = math.ceil(rate / each)
        why = f"{goodput:.1f} of {rate:.0f} Mbit/s without measured loss needs {model} streams"
        return min(most, max(2 * n, model)), why
    return n, ""

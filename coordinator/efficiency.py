"""Each link's exchange against its physical floor, and what limits it when it is far above.

The floor of one round's exchange on a link is one round trip plus its bytes, both ways,
at the link's rate: ``RTT + (up + down) x 8 / rate``. Nobody moves bytes faster, so the
ratio of the measured exchange to it says how much of the link a round wastes
(``docs/striping.md``). The rate is the operator's figure for the link when configured,
else the best goodput the link has shown, which a loss-limited link understates: the
limit then says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from skyfed.netinfo import MSS_BYTES, mathis_mbit
from skyfed.status import Efficiency

HIGH_RATIO = 1.5
"""Above this exchange / floor ratio the link's limit is named."""


@dataclass(frozen=True, slots=True)
class Exchange:
    """One link's exchange in one round, as measured."""

    round: int
    up_s: float
    """From the agent sending its contribution to its receipt arriving (the agent's clock)."""
    down_s: float
    """From the aggregate's first chunk arriving at the agent to its round end (the
    agent's clock)."""
    codec_s: float
    """The agent's encoding of its contribution and decoding of the aggregate."""
    bytes_up: int
    bytes_down: int
    streams: int
    """Connections the session striped over in that round."""


def floor_s(rtt_ms: float, nbytes: int, rate_mbit: float) -> float:
    """One round trip plus ``nbytes`` at ``rate_mbit``: the fastest an exchange can be."""
    if not (rtt_ms >= 0 and rate_mbit > 0):
        return math.nan
    return rtt_ms / 1000 + nbytes * 8 / (rate_mbit * 1e6)


def assess(
    exchange: Exchange,
    *,
    rtt_ms: float,
    loss_pct: float,
    rate_mbit: float,
    max_streams: int,
    mss_bytes: int = MSS_BYTES,
    loss_based: bool = True,
) -> Efficiency:
    """The exchange against the floor of a link at ``rtt_ms``, ``loss_pct`` and ``rate_mbit``
    (``loss_based``: an end's congestion control backs off on random loss; False for BBR
    on both ends, whose streams Mathis's cap does not bound)."""
    total_s = exchange.up_s + exchange.down_s
    nbytes = exchange.bytes_up + exchange.bytes_down
    floor = floor_s(rtt_ms, nbytes, rate_mbit)
    ratio = total_s / floor if floor > 0 and total_s > 0 else math.nan
    wire_s = total_s - exchange.codec_s
    goodput = nbytes * 8 / wire_s / 1e6 if wire_s > 0 else math.nan
    limit = ""
    if ratio > HIGH_RATIO:
        limit = _limit(
            exchange, total_s, goodput, rtt_ms, loss_pct, max_streams, mss_bytes, loss_based
        )
    return Efficiency(
        round=exchange.round,
        exchange_s=total_s,
        floor_s=floor,
        ratio=ratio,
        rtt_ms=rtt_ms,
        rate_mbit=rate_mbit,
        goodput_mbit=goodput,
        streams=exchange.streams,
        limit=limit,
    )


def _limit(
    exchange: Exchange,
    total_s: float,
    goodput_mbit: float,
    rtt_ms: float,
    loss_pct: float,
    max_streams: int,
    mss_bytes: int,
    loss_based: bool,
) -> str:
    """The resource the evidence points at, most specific first."""
    if exchange.codec_s > 0.5 * total_s:
        return f"codec CPU: {exchange.codec_s:.2f} of {total_s:.2f} s encoding and decoding"
    rtts = total_s / (rtt_ms / 1000) if rtt_ms > 0 else math.nan
    if rtts <= 4:
        return f"round trips: the exchange took {rtts:.1f} of them"
    n = max(1, exchange.streams)
    if not loss_based and loss_pct > 0:
        return (
            f"loss recovery: {goodput_mbit:.1f} Mbit/s over {n} stream(s) at {loss_pct:.2f} % "
            "loss; BBR does not back off on it, but each lost segment costs a round trip"
        )
    cap = mathis_mbit(rtt_ms, loss_pct, mss_bytes)
    if math.isfinite(cap) and goodput_mbit / n >= 0.5 * cap:
        more = "" if n < max_streams else f", already at max_streams = {max_streams}"
        return (
            f"loss-limited streams: {n} x {cap:.1f} Mbit/s (Mathis at {rtt_ms:.0f} ms, "
            f"{loss_pct:.2f} % loss){more}"
        )
    if not math.isfinite(cap):
        return (
            f"window or slow start: {goodput_mbit:.1f} Mbit/s over {n} stream(s) on a link "
            "without measured loss"
        )
    return f"unexplained: {goodput_mbit:.1f} Mbit/s over {n} stream(s), {cap:.1f} each allowed"

"""What the coordinator sees of a link itself, and the bound it puts on the agent's claims.

An agent reports its round trips and probe losses; one agent claiming 400 ms and 50 %
loss moved every agent's downlink to 2-bit EC-SGD. So every claim is bounded by the
coordinator's own view of that link (docs/security.md, "Link figures"): round trips of its
own heartbeats, which the agent echoes at once, and the gaps in the probe sequence numbers
its UDP echo receives. A claimed round trip counts up to ``RTT_SLACK`` x the longest round
trip the coordinator saw in the last ``RTT_WINDOW_S`` seconds (none seen: the claim does
not count); claimed losses up to twice the uplink loss the echo saw (a round trip crosses
the link twice) plus ``LOSS_SLACK_PCT`` of the probes.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque

RTT_WINDOW_S = 10.0
RTT_SLACK = 1.5
RTT_SLACK_MS = 5.0
"""Claims may exceed the observed round trip by this much: UDP and TCP paths differ."""
LOSS_SLACK_PCT = 1.0
PENDING_BEATS = 16
"""Our heartbeats awaiting an echo; older ones are forgotten (a lost echo)."""


class Observed:
    """One link's coordinator-side round trips, and the bounds they put on claims."""

    def __init__(self) -> None:
        self._pending: OrderedDict[int, None] = OrderedDict()
        self._rtts: deque[tuple[float, float]] = deque(maxlen=64)  # (monotonic s, ms)

    def sent(self, sent_ns: int) -> None:
        """We sent a heartbeat stamped ``sent_ns``; its echo times a round trip."""
        self._pending[sent_ns] = None
        while len(self._pending) > PENDING_BEATS:
            self._pending.popitem(last=False)

    def echoed(self, echo_ns: int, now_ns: int) -> float | None:
        """The round trip of one of our own heartbeats the agent echoed; None for an echo
        of anything we did not send (or sent long ago)."""
        if echo_ns not in self._pending:
            return None
        del self._pending[echo_ns]
        rtt_ms = (now_ns - echo_ns) / 1e6
        self._rtts.append((now_ns / 1e9, rtt_ms))
        return rtt_ms

    def bound_rtt(self, claimed_ms: float, now_s: float | None = None) -> float | None:
        """The claim, bounded by what we saw; None when we saw no round trip lately."""
        now_s = time.monotonic() if now_s is None else now_s
        recent = [ms for t, ms in self._rtts if now_s - t <= RTT_WINDOW_S]
        if not recent:
            return None
        return min(claimed_ms, RTT_SLACK * max(recent) + RTT_SLACK_MS)

    @staticmethod
    def bound_lost(claimed_lost: int, claimed_settled: int, sent: int, received: int) -> int:
        """Claimed lost probes (since the session began), bounded by the echo's own count:
        ``sent`` probe sequence numbers seen up to the highest, ``received`` of them."""
        uplink_lost = max(0, sent - received)
        slack = math.ceil(claimed_settled * LOSS_SLACK_PCT / 100)
        return min(claimed_lost, 2 * uplink_lost + slack)

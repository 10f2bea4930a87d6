"""The bandwidth monitor of one link: RTT, jitter, loss and goodput, per window and smoothed.

Pure bookkeeping, no I/O: whoever owns the link feeds it samples with their timestamps
(heartbeat and probe round trips, settled probe counts, gradient transfers) and calls
:meth:`LinkMonitor.poll`, which closes every window that has ended. Each closed window is
summarised robustly (the median RTT, so one round trip stuck behind a gradient transfer
does not move it) and folded into exponentially weighted averages. Raw samples are kept,
bounded, for plots.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from skyfed.config.checks import check_types, require


@dataclass(kw_only=True, slots=True)
class MonitorConfig:
    """How a link's measurements are windowed and smoothed."""

    window_s: float = 2.0
    """Length of one measurement window; the link policy takes one step per window."""
    alpha: float = 0.5
    """EWMA weight of the newest window for RTT, jitter and goodput (1.0: no smoothing)."""
    loss_alpha: float = 0.3
    """EWMA weight of the newest window's probe counts (loss needs more samples than RTT)."""
    max_samples: int = 4096
    """Raw samples kept per kind for plots; the oldest are dropped beyond it."""
    min_goodput_bytes: int = 32 << 10
    """Transfers smaller than this say more about latency than rate: no goodput sample."""

    def __post_init__(self) -> None:
        check_types(self, "monitor")
        window_ok = math.isfinite(self.window_s) and self.window_s > 0
        require("monitor", window_ok, "window_s", self.window_s, "finite and > 0")
        require("monitor", 0 < self.alpha <= 1, "alpha", self.alpha, "in (0, 1]")
        require("monitor", 0 < self.loss_alpha <= 1, "loss_alpha", self.loss_alpha, "in (0, 1]")
        require("monitor", self.max_samples >= 16, "max_samples", self.max_samples, ">= 16")
        goodput = self.min_goodput_bytes
        require("monitor", goodput >= 0, "min_goodput_bytes", goodput, ">= 0")


@dataclass(frozen=True, slots=True)
class LinkStats:
    """A link's smoothed figures; ``nan`` where nothing was measured yet."""

    rtt_ms: float = math.nan
    jitter_ms: float = math.nan
    loss_pct: float = math.nan
    """One-way packet loss, from round-trip probe loss assuming both directions alike."""
    goodput_mbit: float = math.nan
    goodput_rtt_ms: float = math.nan
    """The RTT while ``goodput_mbit`` was measured: a transfer that a window, not the line
    rate, limits runs at about one window per round trip, so the policy rescales goodput
    by this over the current RTT (the codec in use may send too little to measure it)."""
    windows: int = 0
    """Windows closed so far."""

    def describe(self) -> str:
        """``rtt_ms=... loss_pct=... goodput_mbit=...`` for logs."""
        return (
            f"rtt_ms={self.rtt_ms:.1f} jitter_ms={self.jitter_ms:.1f} "
            f"loss_pct={self.loss_pct:.2f} goodput_mbit={self.goodput_mbit:.1f}"
        )


@dataclass(frozen=True, slots=True)
class Window:
    """What one window measured (``nan`` where it had no sample of that kind)."""

    start_s: float
    rtt_ms: float
    jitter_ms: float
    probes: int
    probes_lost: int
    goodput_mbit: float


@dataclass(slots=True)
class _Open:
    start_s: float
    rtts_ms: list[float] = field(default_factory=list)
    probes: int = 0
    probes_lost: int = 0
    bytes: int = 0
    seconds: float = 0.0


def one_way_loss_pct(probes: float, lost: float) -> float:
    """One-way loss (percent) from round-trip probe loss, both directions alike:
    ``(1 - p)^2 = 1 - lost / probes``."""
    if probes <= 0:
        return math.nan
    delivered = max(0.0, 1.0 - lost / probes)
    return 100.0 * (1.0 - math.sqrt(delivered))


def jitter_of(rtts_ms: list[float]) -> float:
    """Mean absolute difference of consecutive round trips (RFC 3550's D, unsmoothed)."""
    if len(rtts_ms) < 2:
        return math.nan
    return statistics.fmean(abs(b - a) for a, b in zip(rtts_ms, rtts_ms[1:], strict=False))


class LinkMonitor:
    """Windows and EWMAs of one link's measurements; times are seconds on one clock."""

    def __init__(self, config: MonitorConfig | None = None, *, start_s: float = 0.0) -> None:
        self.config = config or MonitorConfig()
        self._open = _Open(start_s)
        self._ewma: dict[str, float] = {}
        self._probes_ewma = 0.0
        self._lost_ewma = 0.0
        self.windows = 0
        n = self.config.max_samples
        self.rtt_samples: deque[tuple[float, float]] = deque(maxlen=n)
        """(time_s, rtt_ms) of every round trip measured."""
        self.transfer_samples: deque[tuple[float, int, float]] = deque(maxlen=n)
        """(time_s, bytes, seconds) of every gradient transfer measured."""
        self.window_log: deque[Window] = deque(maxlen=n)
        """Every closed window, for plots."""

    # ---- samples -------------------------------------------------------------------------

    def add_rtt(self, now_s: float, rtt_ms: float) -> None:
        if math.isfinite(rtt_ms) and rtt_ms >= 0:
            self.rtt_samples.append((now_s, rtt_ms))
            self._open.rtts_ms.append(rtt_ms)

    def add_probes(self, now_s: float, settled: int, lost: int) -> None:
        """``settled`` probes came back or were given up on; ``lost`` of them never came back."""
        if settled > 0 and 0 <= lost <= settled:
            self._open.probes += settled
            self._open.probes_lost += lost

    def add_transfer(self, now_s: float, nbytes: int, seconds: float) -> None:
        if seconds > 0 and nbytes >= max(1, self.config.min_goodput_bytes):
            self.transfer_samples.append((now_s, nbytes, seconds))
            self._open.bytes += nbytes
            self._open.seconds += seconds

    # ---- windows -------------------------------------------------------------------------

    def poll(self, now_s: float) -> list[Window]:
        """Close every window that ended by ``now_s``; the closed ones, oldest first."""
        closed = []
        width = self.config.window_s
        while now_s - self._open.start_s >= width:
            window = self._close(self._open)
            self._open = _Open(self._open.start_s + width)
            closed.append(window)
        return closed

    def _close(self, w: _Open) -> Window:
        rtt = statistics.median(w.rtts_ms) if w.rtts_ms else math.nan
        window = Window(
            start_s=w.start_s,
            rtt_ms=rtt,
            jitter_ms=jitter_of(w.rtts_ms),
            probes=w.probes,
            probes_lost=w.probes_lost,
            goodput_mbit=w.bytes * 8 / w.seconds / 1e6 if w.seconds > 0 else math.nan,
        )
        self._fold(window)
        self.windows += 1
        self.window_log.append(window)
        return window

    def _fold(self, w: Window) -> None:
        values = {"rtt_ms": w.rtt_ms, "jitter_ms": w.jitter_ms, "goodput_mbit": w.goodput_mbit}
        if math.isfinite(w.goodput_mbit):  # the RTT that goodput was measured at
            rtt = w.rtt_ms if math.isfinite(w.rtt_ms) else self._ewma.get("rtt_ms", math.nan)
            values["goodput_rtt_ms"] = rtt
        for key, value in values.items():
            if math.isfinite(value):
                old = self._ewma.get(key)
                a = self.config.alpha
                self._ewma[key] = value if old is None else a * value + (1 - a) * old
        if w.probes:
            a = self.config.loss_alpha
            first = self._probes_ewma == 0
            self._probes_ewma = w.probes if first else a * w.probes + (1 - a) * self._probes_ewma
            lost = w.probes_lost
            self._lost_ewma = lost if first else a * lost + (1 - a) * self._lost_ewma

    def latest(self) -> LinkStats:
        """What the link policy decides on: the last window's own RTT and jitter (so dwell
        counts independent windows), with the smoothed loss and goodput (one window holds
        too few probes and transfers to judge them)."""
        smoothed = self.stats()
        last = next((w for w in reversed(self.window_log) if math.isfinite(w.rtt_ms)), None)
        if last is None:
            return smoothed
        return LinkStats(
            rtt_ms=last.rtt_ms,
            jitter_ms=last.jitter_ms,
            loss_pct=smoothed.loss_pct,
            goodput_mbit=smoothed.goodput_mbit,
            goodput_rtt_ms=smoothed.goodput_rtt_ms,
            windows=smoothed.windows,
        )

    def stats(self) -> LinkStats:
        """The smoothed figures over the windows closed so far."""
        return LinkStats(
            rtt_ms=self._ewma.get("rtt_ms", math.nan),
            jitter_ms=self._ewma.get("jitter_ms", math.nan),
            loss_pct=one_way_loss_pct(self._probes_ewma, self._lost_ewma),
            goodput_mbit=self._ewma.get("goodput_mbit", math.nan),
            goodput_rtt_ms=self._ewma.get("goodput_rtt_ms", math.nan),
            windows=self.windows,
        )

"""What the network gives this host's connections to a peer: congestion control, send buffering.

gRPC's Python API has no socket hook, so a service cannot choose its connections'
congestion control; it can say which one they get. The route to the peer decides first
(``ip route ... congctl bbr``, as the lab sets it), else the host's default
(``net.ipv4.tcp_congestion_control``). Both ends call :func:`congestion_control` at start
and log it (docs/tune-wan-hosts.md says how to give a real host BBR).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_CC = Path("/proc/sys/net/ipv4/tcp_congestion_control")
NOTSENT_LOWAT = Path("/proc/sys/net/ipv4/tcp_notsent_lowat")
STRIPED_NOTSENT_LOWAT = 32768
"""The bound on a socket's not-yet-sent bytes that hosts whose sessions stripe should set
(``net.ipv4.tcp_notsent_lowat``; the kernel's default is unlimited), and the lab sets.
gRPC takes a lane's next chunk as soon as the socket accepts the last, so without a bound
the slowest connection's send buffer (autotuned to MBs) swallows chunks the other lanes
could carry: on the cross-region lab link a broadcast ran 8 s on one connection at 2.5
Mbit/s while 15 idled, and 16 streams moved 16.4 Mbit/s unbounded against 32.3 with this
bound, side by side (docs/striping.md#send-buffers). It costs no rate on the lab's
1 Gbit/s x 50 ms link."""
UNBOUNDED_NOTSENT = 1 << 20
"""Above this many bytes the bound does not bound anything a striped transfer notices."""
MSS_BYTES = 1448
"""A TCP segment's payload at MTU 1500 with timestamps, for Mathis's formula."""
MATHIS_C = math.sqrt(1.5)
"""Mathis's constant for periodic loss with delayed ACKs off (1.22)."""
CAPPED_BELOW = 0.25
"""Warn when one loss-based stream's Mathis rate is below this share of the link's rate."""
LOSS_BASED = frozenset({"reno", "cubic", "htcp", "bic", "highspeed", "scalable", "westwood"})
"""Congestion controls that halve their window on a random loss (Mathis: rate ~ 1/sqrt(p))."""
MODEL_BASED = frozenset({"bbr", "bbr2", "bbr3"})
"""Congestion controls that pace at a model of the path's rate and do not back off on a
random loss: Mathis's cap does not bound their streams."""


@dataclass(kw_only=True, slots=True, frozen=True)
class CongestionControl:
    """The congestion control TCP connections to one peer get, and where it comes from."""

    name: str
    """Algorithm name as the kernel spells it (``cubic``, ``bbr``), or ``unknown``."""
    source: str
    """``route`` (a ``congctl`` metric on the route to the peer), ``host`` (the default
    sysctl) or ``unknown`` (neither could be read: not Linux)."""

    @property
    def loss_based(self) -> bool:
        """True for an algorithm that a random loss slows (CUBIC, Reno, ...)."""
        return self.name in LOSS_BASED

    @property
    def model_based(self) -> bool:
        """True for an algorithm that a random loss does not slow (BBR); False for the
        rest, an unknown one included."""
        return self.name in MODEL_BASED


def target_host(target: str) -> str:
    """The host of a ``host:port`` target (``[::1]:5000``: ``::1``)."""
    return target.rpartition(":")[0].strip("[]")


def peer_host(grpc_peer: str) -> str:
    """The address in a gRPC peer string (``ipv4:10.0.0.2:5000``, ``ipv6:[::1]:5000``)."""
    kind, _, rest = grpc_peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return grpc_peer
    return target_host(rest)


def congestion_control(peer: str | None) -> CongestionControl:
    """The congestion control of this host's TCP connections to ``peer`` (a host or
    address; None: the host's default, which a route to a peer may override)."""
    if peer is None:
        return _host_default()
    try:
        addr = socket.getaddrinfo(peer, None, socket.AF_INET)[0][4][0]
    except (OSError, IndexError):
        addr = peer
    name = _route_congctl(str(addr))
    if name:
        return CongestionControl(name=name, source="route")
    return _host_default()


def _host_default() -> CongestionControl:
    try:
        return CongestionControl(name=DEFAULT_CC.read_text().strip(), source="host")
    except OSError:
        return CongestionControl(name="unknown", source="unknown")


def mathis_mbit(rtt_ms: float, loss_pct: float, mss_bytes: int = MSS_BYTES) -> float:
    """The most one loss-based TCP stream moves at ``rtt_ms`` and ``loss_pct`` one-way
    loss, in Mbit/s (Mathis et al.: MSS / RTT x C / sqrt(p)); inf without loss (a window
    or the path limits it, not loss), nan while RTT is unknown."""
    if not (math.isfinite(rtt_ms) and rtt_ms > 0):
        return math.nan
    p = loss_pct / 100 if math.isfinite(loss_pct) else 0.0
    if p <= 0:
        return math.inf
    return mss_bytes * 8 / (rtt_ms / 1000) * MATHIS_C / math.sqrt(p) / 1e6


def loss_cap_warning(
    cc: CongestionControl, *, rtt_ms: float, loss_pct: float, rate_mbit: float
) -> str | None:
    """The warning for a loss-based congestion control on a link whose measured loss caps one
    stream far below the link's measured rate, or None. The link monitor calls it with its
    figures (``rate_mbit``: measured goodput or capacity; docs/wan.md)."""
    cap = mathis_mbit(rtt_ms, loss_pct)
    if not cc.loss_based or rate_mbit <= 0 or not cap < CAPPED_BELOW * rate_mbit:
        return None  # also without a round trip: the cap is then unknown (nan)
    return (
        f"{cc.name} (from the {cc.source}) on a link with {loss_pct:.2g} % loss at {rtt_ms:.0f} ms "
        f"holds one stream to about {cap:.1f} Mbit/s of {rate_mbit:.0f}: give the hosts BBR "
        "(net.ipv4.tcp_congestion_control=bbr, docs/wan.md) or stripe the session"
    )


def log_congestion_control(peer: str | None, role: str) -> CongestionControl:
    """Log (and return) what :func:`congestion_control` finds for ``peer``."""
    cc = congestion_control(peer)
    shown = peer or "(host default)"
    logger.info("[NetInfo.CC] role=%s peer=%s cc=%s source=%s", role, shown, cc.name, cc.source)
    return cc


def notsent_lowat() -> int | None:
    """``net.ipv4.tcp_notsent_lowat`` of this host (its network namespace), or None where
    it cannot be read (not Linux)."""
    try:
        return int(NOTSENT_LOWAT.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def notsent_lowat_warning(lowat: int | None) -> str | None:
    """The warning for a host whose sessions stripe with unbounded unsent socket data, or
    None (a bound of at most :data:`UNBOUNDED_NOTSENT`, or unknown)."""
    if lowat is None or lowat <= UNBOUNDED_NOTSENT:
        return None
    return (
        f"net.ipv4.tcp_notsent_lowat is {lowat}: a striped session's slowest connection can "
        f"hold MBs of chunks while its other connections idle; set it to {STRIPED_NOTSENT_LOWAT} "
        "(docs/striping.md#send-buffers)"
    )


def log_send_buffering(role: str, *, striping: bool) -> int | None:
    """Log this host's ``tcp_notsent_lowat`` (and return it); with ``striping`` (a session
    is about to use more than one connection) warn where the bound is missing. Services
    call it at start without, and at their first striped session with: a federation
    whose links never stripe needs no sysctl, and a local demo no warning."""
    lowat = notsent_lowat()
    logger.info("[NetInfo.SendBuffer] role=%s notsent_lowat=%s", role, lowat)
    warning = notsent_lowat_warning(lowat) if striping else None
    if warning:
        logger.warning("[NetInfo.SendBuffer] role=%s %s", role, warning)
    return lowat


def _route_congctl(addr: str) -> str | None:
    ip = shutil.which("ip")
    if ip is None:
        return None
    try:
        out = subprocess.run(
            [ip, "-j", "-d", "route", "get", addr], capture_output=True, text=True, timeout=5
        ).stdout
        routes = json.loads(out) if out.strip() else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    for route in routes:
        for metric in route.get("metrics", []):
            if isinstance(metric, dict) and "congestion" in metric:  # iproute2's JSON name
                return str(metric["congestion"]).removeprefix("lock ").strip()
    return None

"""Link self-check: measure RTT, loss and rate of a lab link and compare them with its profile."""

from __future__ import annotations

import json
import logging
import math
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from skyfed.config.checks import require
from skyfed.lab.netns import LabError, Namespace
from skyfed.lab.profiles import LinkProfile
from skyfed.lab.topology import COORDINATOR, Lab
from skyfed.procs import terminate

logger = logging.getLogger(__name__)

PROBE_PORT = 47000


@dataclass(kw_only=True, slots=True, frozen=True)
class CheckSettings:
    """How hard and how strictly a link is measured."""

    probes: int = 2000
    """UDP probes for RTT and loss (enough that 0.5 % loss loses about 20 round trips)."""
    interval_ms: float = 0.5
    """Gap between probes."""
    rate_duration_s: float = 1.0
    """How long each direction's rate test sends. 1 s measured every named profile, 50 Mbit/s
    to 1 Gbit/s, at 96.9-100.4 % of its rate (the tolerance is 10 %); 1.5 s, the default
    until then, took half as long again."""
    overdrive: float = 1.25
    """The rate test offers this multiple of the profile's rate."""
    rtt_tolerance: float = 0.10
    """Allowed relative RTT error..."""
    rtt_floor_ms: float = 2.0
    """...or this absolute error, whichever is larger."""
    rate_tolerance: float = 0.10
    """Allowed relative rate error."""
    alpha: float = 1e-4
    """Probability that a correct link fails the (two-sided, exact binomial) loss test."""
    port: int = PROBE_PORT
    """Port of the probe servers (one per link when links are measured at once)."""

    def __post_init__(self) -> None:
        require("selfcheck", self.probes >= 100, "probes", self.probes, ">= 100")
        interval = self.interval_ms
        require("selfcheck", 0.05 <= interval <= 100, "interval_ms", interval, "in [0.05, 100]")
        duration = self.rate_duration_s
        require("selfcheck", 0.2 <= duration <= 60, "rate_duration_s", duration, "in [0.2, 60]")
        require("selfcheck", 1.0 < self.overdrive <= 4.0, "overdrive", self.overdrive, "in (1, 4]")
        for name in ("rtt_tolerance", "rate_tolerance", "alpha"):
            value = getattr(self, name)
            require("selfcheck", 0 < value < 1, name, value, "in (0, 1)")
        require("selfcheck", 0 < self.port < 65536, "port", self.port, "in (0, 65536)")


@dataclass(kw_only=True, slots=True)
class LinkReport:
    """What was measured on one link, against what its profile says."""

    agent: str
    profile: str
    mechanism: str
    rtt_ms: float
    rtt_measured_ms: float = math.nan
    jitter_measured_ms: float = math.nan
    probes: int = 0
    probes_lost: int = 0
    loss_bound: tuple[int, int] = (0, 0)
    round_trip_loss_pct: float = 0.0
    rate_mbit: float = 0.0
    rate_up_mbit: float = math.nan
    rate_down_mbit: float = math.nan
    tx_drops: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every figure is within its tolerance."""
        return not self.problems

    def summary(self) -> str:
        """One line for people."""
        rate = "unlimited" if not self.rate_mbit else f"{self.rate_mbit:g}"
        return (
            f"{self.agent} [{self.profile} via {self.mechanism}] "
            f"rtt {self.rtt_measured_ms:.2f}/{self.rtt_ms:g} ms, "
            f"lost {self.probes_lost}/{self.probes} (bound {self.loss_bound[0]}-"
            f"{self.loss_bound[1]}), rate up {self.rate_up_mbit:.1f} down "
            f"{self.rate_down_mbit:.1f}/{rate} Mbit/s, tx drops {self.tx_drops}: "
            + ("ok" if self.ok else "; ".join(self.problems))
        )

    def to_dict(self) -> dict[str, object]:
        """Plain data for JSON output."""
        return {**asdict(self), "ok": self.ok}


class LinkCheckError(LabError):
    """A link does not match its profile; ``reports`` hold the measured figures."""

    def __init__(self, reports: Sequence[LinkReport]) -> None:
        self.reports = list(reports)
        bad = [r.summary() for r in self.reports if not r.ok]
        super().__init__("link self-check failed:\n  " + "\n  ".join(bad))


def check_lab(lab: Lab, settings: CheckSettings | None = None) -> list[LinkReport]:
    """Check every link in turn; raise ``LinkCheckError`` if any does not match.

    Each link is measured once: rate and loss are the kernel's, and the delay line and the
    probes run at real-time priority, so a busy host is no excuse for a second try (the
    check under a training federation is in bench/wan.py --check-under-load).
    """
    reports = [measure_link(lab, agent, settings) for agent in lab.links]
    if not all(r.ok for r in reports):
        raise LinkCheckError(reports)
    return reports


def measure_link(
    lab: Lab,
    agent: str,
    settings: CheckSettings | None = None,
    *,
    expected: LinkProfile | None = None,
) -> LinkReport:
    """Measure ``agent``'s link against ``expected`` (default: the profile it was given);
    a mismatch is reported in ``problems``, not raised."""
    s = settings or CheckSettings()
    link = lab.link(agent)
    p = expected or link.profile
    report = LinkReport(
        agent=agent,
        profile=p.name,
        mechanism=link.mechanism,
        rtt_ms=p.rtt_ms,
        rate_mbit=p.rate_mbit,
    )
    drops_before = link.tx_drops()
    _measure_rtt_loss(lab, agent, s, report)
    if p.rate_mbit:
        report.rate_up_mbit = _measure_rate(lab, agent, COORDINATOR, p.rate_mbit, s)
        report.rate_down_mbit = _measure_rate(lab, COORDINATOR, agent, p.rate_mbit, s)
    report.tx_drops = link.tx_drops() - drops_before
    report.problems = _judge(report, p.loss, s)
    logger.info("[Lab.Check] %s", report.summary())
    return report


def _measure_rtt_loss(lab: Lab, agent: str, s: CheckSettings, report: LinkReport) -> None:
    addr = str(lab.address(COORDINATOR))
    wait_s = 2 * report.rtt_ms / 1000 + 0.5
    duration_s = s.probes * s.interval_ms / 1000 + wait_s + 5
    echo_args = ["echo", "--bind", addr, "--duration-s", f"{duration_s}"]
    echo = _serve(lab.hosts[COORDINATOR], echo_args, s.port)
    try:
        args = ["ping", "--to", addr, "--count", str(s.probes)]
        args += ["--interval-ms", str(s.interval_ms), "--wait-s", str(wait_s)]
        result = _tool(lab.hosts[agent], args, timeout_s=duration_s + 10, port=s.port)
    finally:
        terminate(echo)
    rtts = result["rtts_ms"]
    report.probes, report.probes_lost = result["sent"], result["sent"] - result["received"]
    if rtts:
        report.rtt_measured_ms = statistics.median(rtts)
        report.jitter_measured_ms = statistics.pstdev(rtts)


def _measure_rate(lab: Lab, src: str, dst: str, rate_mbit: float, s: CheckSettings) -> float:
    addr = str(lab.address(dst))
    sink_args = ["sink", "--bind", addr, "--duration-s", str(s.rate_duration_s + 10)]
    sink = _serve(lab.hosts[dst], sink_args, s.port)
    try:
        args = ["blast", "--to", addr, "--rate-mbit", str(rate_mbit * s.overdrive)]
        args += ["--duration-s", str(s.rate_duration_s)]
        _tool(lab.hosts[src], args, timeout_s=30, port=s.port)
        out, _ = sink.communicate(timeout=s.rate_duration_s + 15)
    finally:
        terminate(sink)
    got = json.loads(out.splitlines()[-1])
    span_s = got["last"] - got["first"]
    if got["packets"] < 2 or span_s <= 0:
        return 0.0
    return (got["packets"] - 1) * got["ip_bytes"] * 8 / span_s / 1e6


def _judge(r: LinkReport, loss: float, s: CheckSettings) -> list[str]:
    problems = []
    if not abs(r.rtt_measured_ms - r.rtt_ms) <= max(s.rtt_tolerance * r.rtt_ms, s.rtt_floor_ms):
        problems.append(f"rtt {r.rtt_measured_ms:.2f} ms, profile {r.rtt_ms:g} ms")
    q = 1 - (1 - loss) ** 2
    r.round_trip_loss_pct = 100 * q
    r.loss_bound = binomial_interval(r.probes, q, s.alpha)
    if not r.loss_bound[0] <= r.probes_lost <= r.loss_bound[1]:
        problems.append(
            f"lost {r.probes_lost}/{r.probes} probes, expected {r.loss_bound[0]}-"
            f"{r.loss_bound[1]} at {100 * q:.2f} % round-trip loss"
        )
    for direction, got in (("up", r.rate_up_mbit), ("down", r.rate_down_mbit)):
        if r.rate_mbit and not abs(got - r.rate_mbit) <= s.rate_tolerance * r.rate_mbit:
            problems.append(f"rate {direction} {got:.1f} Mbit/s, profile {r.rate_mbit:g} Mbit/s")
    if r.tx_drops:
        problems.append(f"{r.tx_drops} packets dropped at a device queue (shaper fell behind)")
    return problems


def binomial_interval(n: int, p: float, alpha: float) -> tuple[int, int]:
    """Smallest ``(lo, hi)`` with P(X < lo) <= alpha/2 and P(X > hi) <= alpha/2, X ~ B(n, p)."""
    if p <= 0:
        return 0, 0
    if p >= 1:
        return n, n
    log_pmf = [
        math.lgamma(n + 1)
        - math.lgamma(k + 1)
        - math.lgamma(n - k + 1)
        + k * math.log(p)
        + (n - k) * math.log1p(-p)
        for k in range(n + 1)
    ]
    pmf = [math.exp(v) for v in log_pmf]
    lo, tail = 0, 0.0
    while tail + pmf[lo] <= alpha / 2:
        tail += pmf[lo]
        lo += 1
    hi, tail = n, 0.0
    while tail + pmf[hi] <= alpha / 2:
        tail += pmf[hi]
        hi -= 1
    return lo, hi


def measure_ceiling(lab: Lab, agent: str, duration_s: float = 3.0) -> float:
    """TCP goodput (Mbit/s) from ``agent`` to the coordinator: the shaper's own ceiling
    when the link's profile has no rate limit."""
    addr = str(lab.address(COORDINATOR))
    sink = _serve(lab.hosts[COORDINATOR], ["tcp-sink", "--bind", addr, "--duration-s", "30"])
    try:
        args = ["tcp-send", "--to", addr, "--duration-s", str(duration_s)]
        _tool(lab.hosts[agent], args, timeout_s=duration_s + 30)
        out, _ = sink.communicate(timeout=30)
    finally:
        terminate(sink)
    got = json.loads(out.splitlines()[-1])
    return got["bytes"] * 8 / got["seconds"] / 1e6


def _probe_argv(ns: Namespace, args: Sequence[str], port: int) -> list[str]:
    return ns.exec_argv([sys.executable, "-m", "skyfed.lab.probe", *args, "--port", str(port)])


def _serve(ns: Namespace, args: Sequence[str], port: int = PROBE_PORT) -> subprocess.Popen[str]:
    proc = subprocess.Popen(_probe_argv(ns, args, port), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        terminate(proc)
        raise LabError(f"probe server {args[0]} did not start in {ns.name}")
    return proc


def _tool(ns: Namespace, args: Sequence[str], *, timeout_s: float, port: int = PROBE_PORT) -> dict:
    out = subprocess.run(
        _probe_argv(ns, args, port), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if out.returncode != 0:
        raise LabError(f"probe {args[0]} failed in {ns.name}: {out.stderr.strip()}")
    return json.loads(out.stdout.splitlines()[-1])

"""Every agent link's monitor and policy state: probes, heartbeats, transfers in; codecs out.

Agents measure round trips and probe loss on their side; each probe reports the round
trips since the last one to the echo (:meth:`LinkState.probe_rtt`), heartbeats the
probe's counts; the coordinator times the gradient transfers it receives. Each link's
:class:`~skyfed.compression.monitor.LinkMonitor` closes a window every ``window_s``,
the policy takes one step per window, and the round engine reads the link's codec at the
next round boundary (:meth:`Links.codec`), so a switch never lands mid-round.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from skyfed.compression.monitor import LinkMonitor, LinkStats, MonitorConfig, one_way_loss_pct
from skyfed.compression.policy import CodecProfile, PolicyConfig, PolicyState, profile_codecs, step
from skyfed.coordinator import streams as stream_policy
from skyfed.coordinator.efficiency import Exchange, assess
from skyfed.coordinator.observed import Observed
from skyfed.coordinator.probe import ProbeEcho, ProbeKey
from skyfed.coordinator.streams import StreamsConfig, StreamsState
from skyfed.netinfo import log_send_buffering, loss_cap_warning
from skyfed.status import Efficiency
from skyfed.wire import ExchangeTiming, Heartbeat

if TYPE_CHECKING:
    from skyfed.coordinator.session import Session

log = logging.getLogger(__name__)

AUTO = "auto"
"""The coordinator's ``codec`` that lets the link policy choose per link."""
PROFILE_MAX_NUMEL = 1 << 22
STREAM_LOSS_PROBES = 4000
"""Probes the N policy's loss figure spans, about (then older counts weigh half): a few
hundred probes hold one or two lost ones at 0.5 % loss, too few for the EWMA of 2 s
windows to judge, so the stream policy counts over minutes instead."""
STREAM_RTT_AFTER_S = 2.0
"""With no probe report for this long (no probe, an agent from before round trips rode on
it, or a path that drops them), the heartbeats' own round trip stands in."""


@dataclass(frozen=True, slots=True)
class CodecRun:
    """The codec a link (or the downlink) runs and the round it started from: the one home
    of a link's codec; Top-k's density warm-up counts from ``since``."""

    codec: str = ""
    since: int = 0

    def at(self, codec: str, round_: int) -> CodecRun:
        """This run once ``codec`` runs in ``round_``: unchanged if it ran that codec
        already, else from ``round_``; a first codec from round 0, as a late join or a
        coordinator restart meets residuals that kept their work, and Top-k's warm-up,
        which counts from the second figure, must not start again for them."""
        if codec == self.codec:
            return self
        return CodecRun(codec, round_ if self.codec else 0)

    def params(self, policy: PolicyConfig, round_: int, local_steps: int = 0) -> dict[str, Any]:
        """The codec's constructor parameters in ``round_``: the one place they are worked
        out for a round (the policy's, at the run's age, for ``local_steps`` per round)."""
        return policy.codec_params(self.codec, round_ - self.since, local_steps)


class LinkState:
    """One agent's link: its monitor, its policy state, and its probe credentials."""

    def __init__(
        self,
        policy: PolicyConfig,
        monitor: MonitorConfig,
        profiles: dict[str, CodecProfile] | None,
        streams: StreamsConfig | None = None,
        rate_mbit: float = 0.0,
    ) -> None:
        self.policy, self.profiles = policy, profiles
        self.streams_config = streams or StreamsConfig()
        self.rate_mbit = rate_mbit
        """The link's rate as the operator gave it (``link_rate_mbit``; 0: not known)."""
        self.probe_counts = (0.0, 0.0)
        """Probes settled and lost on this link over about ``STREAM_LOSS_PROBES``: the
        N policy's loss figure, kept across the agent's sessions."""
        self.streams = StreamsState(
            streams=self.streams_config.min_streams, warmup=self.streams_config.warmup_transfers
        )
        """How many connections the policy wants the link's session on, and its probe.
        Kept across the agent's sessions, as the codec is."""
        self.streams_decided: stream_policy.Decision | None = None
        """The step that last changed ``streams``: what its change is logged with."""
        self.best_mbit = 0.0
        """The best goodput an upload on this link has shown: the floor's rate when the
        operator gave none."""
        self.loss_based = True
        """Whether a random loss slows the link's streams (an end's congestion control is
        loss-based, or not known): only then does Mathis's cap bound them and call for
        more streams (``Links.open`` sets it from both ends' congestion controls)."""
        self.cc_warned = False
        """Whether the loss-capped congestion control warning was logged (once a link)."""
        self.monitor = LinkMonitor(monitor, start_s=time.monotonic())
        self.state = PolicyState(policy.light)
        self.probe: ProbeKey | None = None
        self.decided_on = LinkStats()
        """The figures of the step that chose the link's codec: what its switch is logged
        with (windows that close before the round boundary do not replace them)."""
        self.lock = threading.Lock()
        self.observed = Observed()
        """The coordinator's own view of the link: it bounds the agent's claims."""
        self._settled = self._lost = 0
        self._reported_at = -math.inf  # when the probe last reported a round trip
        self._upload: tuple[float, int] | None = None
        self.train_s = 0.0
        """The agent's local training time per round, from its latest contribution."""
        self.run = CodecRun()
        """The codec this link runs (its sessions' contributions, from the round boundary
        the policy's choice was taken at) and since when. Kept across the agent's sessions,
        as the agent's residual is. ``state.codec`` is the policy's wish, which may change
        mid-round."""

    def restart(self) -> None:
        """A new session: its probe counts start from zero again."""
        with self.lock:
            self._settled = self._lost = 0
            self._upload = None

    def heartbeat(self, beat: Heartbeat, now_s: float) -> None:
        """An agent's heartbeat: its claims count only as far as the coordinator's own
        view of this link bears them out (``coordinator/observed.py``)."""
        with self.lock:
            if beat.echo_ns:
                self.observed.echoed(beat.echo_ns, time.monotonic_ns())
            rtt_ms = self.observed.bound_rtt(beat.rtt_ms, now_s) if beat.rtt_ms > 0 else None
            if rtt_ms is not None and now_s - self._reported_at > STREAM_RTT_AFTER_S:
                # The stream's round trip, which a transfer in flight inflates: a stand-in.
                self.monitor.add_rtt(now_s, rtt_ms)
            lost_total = self._bounded_lost(beat)
            settled = beat.probes_settled - self._settled
            lost = lost_total - self._lost
            if settled >= 0 and lost >= 0:
                self.monitor.add_probes(now_s, settled, lost)
                self._count_probes(settled, lost)
                self._settled, self._lost = beat.probes_settled, lost_total
            self._advance(now_s)

    def _count_probes(self, settled: int, lost: int) -> None:
        total, gone = self.probe_counts
        total, gone = total + settled, gone + lost
        if total > STREAM_LOSS_PROBES:  # forget slowly: loss on a path changes over minutes
            total, gone = total / 2, gone / 2
        self.probe_counts = (total, gone)

    def stream_loss_pct(self) -> float:
        """One-way loss over the link's last few thousand probes (nan before any)."""
        return one_way_loss_pct(*self.probe_counts)

    def _bounded_lost(self, beat: Heartbeat) -> int:
        key = self.probe
        if key is None:
            return 0  # no probe of ours runs: claimed counts are no evidence
        sent = key.last_seq + 1
        return Observed.bound_lost(beat.probes_lost, beat.probes_settled, sent, key.received)

    def probe_rtt(self, rtt_ms: float) -> None:
        """A round trip the agent's probe measured, reported on its next probe (bounded
        by the round trips the coordinator saw itself)."""
        with self.lock:
            now_s = self._reported_at = time.monotonic()
            bounded = self.observed.bound_rtt(rtt_ms, now_s)
            if bounded is not None:
                self.monitor.add_rtt(now_s, bounded)
            self._advance(now_s)

    def upload_begins(self, bytes_up: int, now_s: float) -> None:
        with self.lock:
            self._upload = (now_s, bytes_up)

    def upload_done(
        self,
        bytes_up: int,
        now_s: float,
        train_s: float = 0.0,
        connections: int = 0,
        chunks: int = 0,
    ) -> int:
        """An upload of ``chunks`` chunks ended: time it for the monitor and, on a session
        that stripes over ``connections``, let the policy choose the link's N. Its bytes
        (0 if untimed)."""
        with self.lock:
            if math.isfinite(train_s) and train_s >= 0:
                self.train_s = train_s
            nbytes, goodput_mbit, seconds = 0, math.nan, math.nan
            if self._upload is not None:
                t0, b0 = self._upload
                nbytes, seconds = bytes_up - b0, now_s - t0
                self.monitor.add_transfer(now_s, nbytes, seconds)
                if connections and nbytes >= max(1, self.monitor.config.min_goodput_bytes):
                    goodput_mbit = nbytes * 8 / seconds / 1e6
            self._upload = None
            self._advance(now_s)  # first: the N step sees the RTT of the windows that ended
            if math.isfinite(goodput_mbit):
                self._choose_streams(goodput_mbit, connections, chunks, seconds)
            return nbytes

    def _choose_streams(
        self, goodput_mbit: float, connections: int, chunks: int = 0, seconds: float = math.nan
    ) -> None:
        """One step of the N policy on an upload's goodput (under the lock); an upload
        that did not run on the N the link was told (a lane died, the agent had not
        resized yet) says nothing about that N."""
        self.best_mbit = max(self.best_mbit, goodput_mbit)
        if connections != self.streams.streams:
            return
        decision = stream_policy.step(
            self.streams,
            goodput_mbit,
            self.rtt_ms(),
            self.stream_loss_pct(),
            self.streams_config,
            rate_mbit=self.rate_mbit,
            chunks=chunks,
            seconds=seconds,
            loss_based=self.loss_based,
        )
        log.debug(
            "[Coordinator.Streams] step streams=%d next=%d rtt_ms=%.1f loss_pct=%.2f "
            "probes=%.0f goodput_mbit=%.2f cap_mbit=%.2f rate_mbit=%.0f reason=%s",
            self.streams.streams,
            decision.state.streams,
            decision.rtt_ms,
            decision.loss_pct,
            self.probe_counts[0],
            goodput_mbit,
            decision.cap_mbit,
            decision.rate_mbit,
            decision.reason,
        )
        if decision.state.streams != self.streams.streams:
            self.streams_decided = decision
        self.streams = decision.state

    def _advance(self, now_s: float) -> None:
        for window in self.monitor.poll(now_s):
            if math.isnan(window.rtt_ms) and not window.probes:
                continue  # nothing measured in it: no evidence either way
            stats = self.monitor.latest()
            state = step(self.state, stats, self.policy, self.profiles, self.train_s)
            if state.codec != self.state.codec:
                self.decided_on = stats
            self.state = state

    def stats(self) -> LinkStats:
        with self.lock:
            return self.monitor.stats()

    def rtt_ms(self) -> float:
        """The link's smoothed RTT, or before any window with one closed, the latest
        sample (nan: none yet). A first upload that fills one stream can end before the
        first window does: the agent's echo that times the link waits behind its chunks,
        and without this the N policy measured nothing on it and the link stayed on one
        stream a round longer (docs/striping.md). The caller holds the lock."""
        rtt_ms = self.monitor.stats().rtt_ms
        if not math.isfinite(rtt_ms) and self.monitor.rtt_samples:
            rtt_ms = self.monitor.rtt_samples[-1][1]
        return rtt_ms


class Links:
    """The links of all agents, by identity (a reconnecting agent keeps its link's history)."""

    def __init__(
        self,
        codec: str,
        policy: PolicyConfig,
        monitor: MonitorConfig,
        sizes: list[int],
        streams: StreamsConfig | None = None,
        rate_mbit: float = 0.0,
    ):
        """``sizes``: the model's tensors, in elements (the cost policy times its codecs
        on them); ``rate_mbit``: every link's rate where the operator knows it (0: not)."""
        self.fixed = None if codec == AUTO else codec
        self.policy, self.monitor = policy, monitor
        self.streams_config = streams or StreamsConfig()
        self.rate_mbit = rate_mbit
        self.profiles: dict[str, CodecProfile] | None = None
        if self.fixed is None and policy.mode == "cost":
            self.profiles = _profiles(policy, sizes)
            for p in self.profiles.values():
                log.info(
                    "[Coordinator.Codec] profile codec=%s ratio=%.1f encode_ms=%.2f decode_ms=%.2f",
                    p.name,
                    p.ratio,
                    p.encode_s * 1e3,
                    p.decode_s * 1e3,
                )
        self.echo: ProbeEcho | None = None
        self._links: dict[str, LinkState] = {}
        self._buffers_checked = False
        """Whether the host's send-buffer bound was checked (at the first N > 1)."""

    @property
    def start_codec(self) -> str:
        return self.fixed or self.policy.light

    def open(self, session: Session, round_: int) -> LinkState:
        """The session's link (kept from an earlier session of the same agent), with a fresh
        probe key when the echo runs, running the codec the policy wants from ``round_``."""
        link = self._links.get(session.key)
        if link is None:
            link = self._links[session.key] = LinkState(
                self.policy, self.monitor, self.profiles, self.streams_config, self.rate_mbit
            )
        link.restart()
        if self.echo is not None:
            if link.probe is not None:
                self.echo.unregister(link.probe)
            link.probe = self.echo.register(on_rtt=link.probe_rtt)
        session.link = link
        link.run = link.run.at(self._wanted(session), round_)
        # Mathis's cap binds where either end's congestion control backs off on random
        # loss, or where an end does not say (an agent from before the field).
        ends = (session.cc, session.agent_cc)
        link.loss_based = not all(cc is not None and cc.model_based for cc in ends)
        return link

    def boundary(self, session: Session, next_round: int) -> None:
        """At a round boundary: the link runs the policy's codec from ``next_round`` on."""
        codec = self._wanted(session)
        if codec != session.codec:
            self.switched(session, codec)
            link = self._links[session.key]
            link.run = link.run.at(codec, next_round)

    def streams_at_boundary(self, session: Session) -> int:
        """At a round boundary: the connections the session stripes over from the next
        round (the policy's N within what the agent offered); changes are logged."""
        link = self._links.get(session.key)
        if link is None or not session.stripe_token:
            return session.streams
        with link.lock:
            wanted, decision = link.streams.streams, link.streams_decided
        wanted = max(1, min(wanted, session.max_streams))
        if wanted > 1 and not self._buffers_checked:  # once, at the first striped session
            self._buffers_checked = True
            log_send_buffering("coordinator", striping=True)
        if wanted != session.streams:
            session.stream_switches += 1
            stats = link.stats()
            log.info(
                "[Coordinator.Streams] agent=%s from=%d to=%d rtt_ms=%.1f loss_pct=%.2f "
                "goodput_mbit=%.1f cap_mbit=%.2f reason=%s",
                session.key,
                session.streams,
                wanted,
                decision.rtt_ms if decision else stats.rtt_ms,
                decision.loss_pct if decision else stats.loss_pct,
                decision.goodput_mbit if decision else math.nan,
                decision.cap_mbit if decision else math.nan,
                decision.reason if decision else "",
            )
            session.streams = wanted
        return wanted

    def timed(
        self, session: Session, timing: ExchangeTiming, rate_mbit: float
    ) -> Efficiency | None:
        """The agent's timing of round ``timing.round`` against the link's floor (None if
        that round's bytes are not known here: a coordinator restart, an older round)."""
        link = self._links.get(session.key)
        sent = session.transfers.get(timing.round)
        if link is None or sent is None or not (timing.up_s >= 0 and timing.down_s >= 0):
            return None
        stats = link.stats()
        with link.lock:
            rtt_ms = link.rtt_ms()
        exchange = Exchange(
            round=timing.round,
            up_s=timing.up_s,
            down_s=timing.down_s,
            codec_s=max(0.0, timing.codec_s),
            bytes_up=sent[0],
            bytes_down=sent[1],
            streams=max(1, timing.streams),
        )
        e = assess(
            exchange,
            rtt_ms=rtt_ms,
            loss_pct=stats.loss_pct,
            rate_mbit=rate_mbit or link.best_mbit,
            max_streams=self.streams_config.max_streams,
            mss_bytes=self.streams_config.mss_bytes,
            loss_based=link.loss_based,
        )
        self.warn_if_loss_capped(session, rtt_ms, stats.loss_pct, rate_mbit or link.best_mbit)
        return replace(e, cloud=session.identity.cloud or "", name=session.identity.name)

    def warn_if_loss_capped(
        self, session: Session, rtt_ms: float, loss_pct: float, rate_mbit: float
    ) -> None:
        """Once a link: warn when its connection's congestion control is loss-based and the
        measured loss caps one stream far below the measured rate (docs/wan.md)."""
        link = self._links.get(session.key)
        if link is None or link.cc_warned or session.cc is None:
            return
        if not (math.isfinite(rtt_ms) and math.isfinite(loss_pct)):
            return
        text = loss_cap_warning(session.cc, rtt_ms=rtt_ms, loss_pct=loss_pct, rate_mbit=rate_mbit)
        if text is not None:
            link.cc_warned = True
            log.warning("[Coordinator.Link] agent=%s %s", session.key, text)

    def codec_params(self, session: Session, round_: int) -> str:
        """The link's codec parameters in ``round_`` as JSON, so the agent encodes exactly
        that ("" for the defaults)."""
        link = self._links.get(session.key)
        run = link.run if link is not None else CodecRun(session.codec)
        params = run.params(self.policy, round_, session.local_steps)
        return json.dumps(params, sort_keys=True) if params else ""

    def _wanted(self, session: Session) -> str:
        """The codec for this link's next contribution: the policy's, if the agent has it."""
        wanted = self.codec(session)
        return wanted if not session.codecs or wanted in session.codecs else "fp32"

    def close(self, session: Session) -> None:
        link = self._links.get(session.key)
        if link is not None and link.probe is not None and self.echo is not None:
            self.echo.unregister(link.probe)
            link.probe = None

    def get(self, session: Session) -> LinkState | None:
        return self._links.get(session.key)

    def of(self, session: Session) -> LinkState:
        """The link of an admitted session: it has one from its welcome on."""
        return self._links[session.key]

    def sent_heartbeat(self, session: Session, sent_ns: int) -> None:
        """We stamped a heartbeat to the agent with ``sent_ns``: its echo times the link."""
        link = self._links.get(session.key)
        if link is not None:
            with link.lock:
                link.observed.sent(sent_ns)

    def heartbeat(self, session: Session, beat: Heartbeat) -> None:
        """Feed a heartbeat's measurements; refresh the session's figures for status."""
        link = self._links.get(session.key)
        if link is None:
            session.rtt_ms = beat.rtt_ms
            return
        link.heartbeat(beat, time.monotonic())
        publish(session, link.stats())

    def codec(self, session: Session) -> str:
        """The codec the policy wants on this link now (the fixed one when not adaptive),
        for the agent's local phase (``PolicyConfig.phase_codec``)."""
        link = self._links.get(session.key)
        if self.fixed is not None or link is None:
            return self.start_codec
        with link.lock:
            return self.policy.phase_codec(link.state.codec, session.local_steps)

    def switched(self, session: Session, to: str) -> None:
        """Log and count a switch made at a round boundary, with the figures behind it."""
        link = self._links.get(session.key)
        stats = LinkStats()
        if link is not None:
            with link.lock:
                stats = link.decided_on
        session.codec_switches += 1
        # the parameters it will run with (the long-phase rule's blocks among them)
        params = self.policy.codec_params(to, None, session.local_steps)
        log.info(
            "[Coordinator.Codec] agent=%s from=%s to=%s rtt_ms=%.1f jitter_ms=%.1f "
            "loss_pct=%.2f goodput_mbit=%.1f params=%s local_steps=%d",
            session.key,
            session.codec,
            to,
            stats.rtt_ms,
            stats.jitter_ms,
            stats.loss_pct,
            stats.goodput_mbit,
            json.dumps(params, sort_keys=True, separators=(",", ":")),
            session.local_steps,
        )


def _profiles(policy: PolicyConfig, sizes: list[int]) -> dict[str, CodecProfile]:
    """The ladder's codecs timed on the model's first tensors up to ``PROFILE_MAX_NUMEL``
    elements, scaled to the whole model (a large model would hold the start up)."""
    taken: list[int] = []
    count = 0
    for n in sizes:
        if taken and count + n > PROFILE_MAX_NUMEL:
            break
        taken.append(min(n, PROFILE_MAX_NUMEL))
        count += taken[-1]
    scale = sum(sizes) / count if count else 1.0
    measured = profile_codecs(list(dict.fromkeys(policy.ladder)), policy, taken or [1])
    return {
        name: replace(
            p,
            encode_s=p.encode_s * scale,
            decode_s=p.decode_s * scale,
            payload_bytes=round(p.payload_bytes * scale),
        )
        for name, p in measured.items()
    }


def publish(session: Session, stats: LinkStats) -> None:
    """Copy a link's smoothed figures onto its session (what status shows)."""
    if math.isfinite(stats.rtt_ms):
        session.rtt_ms = stats.rtt_ms
    if math.isfinite(stats.loss_pct):
        session.loss_pct = stats.loss_pct
    if math.isfinite(stats.jitter_ms):
        session.jitter_ms = stats.jitter_ms
    if math.isfinite(stats.goodput_mbit):
        session.goodput_mbit = stats.goodput_mbit

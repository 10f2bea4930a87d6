"""The choice of N per link (``coordinator/streams.py``): Mathis's cap says when more
streams should help, the measured goodput says whether they did."""

from __future__ import annotations

import math
import time

import pytest

from skyfed.certs.identity import Identity
from skyfed.compression.monitor import MonitorConfig
from skyfed.compression.policy import PolicyConfig
from skyfed.coordinator.links import Links
from skyfed.coordinator.session import Session
from skyfed.coordinator.streams import (
    StreamsConfig,
    StreamsState,
    step,
)
from skyfed.netinfo import CongestionControl, mathis_mbit


def run(
    link,
    rtt_ms: float,
    loss_pct: float,
    uploads: int,
    config: StreamsConfig,
    rate_mbit=math.nan,
    loss_based: bool = True,
) -> list[int]:
    """The N of every upload on a link whose goodput at N streams is ``link(N)``, its new
    connections warm at once (``warmup_transfers = 0`` unless the test says otherwise;
    the warm-up has its own test)."""
    state, seen = StreamsState(), []
    for _ in range(uploads):
        seen.append(state.streams)
        goodput = link(state.streams)
        state = step(
            state, goodput, rtt_ms, loss_pct, config, rate_mbit, loss_based=loss_based
        ).state
    return seen


def cold(**fields) -> StreamsConfig:
    """A config whose probes are judged on their first upload."""
    return StreamsConfig(warmup_transfers=0, **fields)


def test_mathis_cap_at_the_cross_region_profile_is_a_few_mbit():
    # 1448 B x 8 / 0.12 s x 1.22 / sqrt(0.005): the figure the issue measured for one stream.
    assert mathis_mbit(120, 0.5) == pytest.approx(1.67, abs=0.01)
    assert mathis_mbit(120, 0.0) == math.inf
    assert math.isnan(mathis_mbit(math.nan, 0.5))


def test_a_loss_limited_link_climbs_until_goodput_stops_growing():
    cap = mathis_mbit(120, 0.5)
    rate = 20.0  # the path is full at 20 Mbit/s: about 12 streams' worth

    def link(n: int) -> float:
        return min(n * cap * 0.9, rate)

    seen = run(link, 120, 0.5, 13, cold(max_streams=64, hold_transfers=4))
    assert seen[:5] == [1, 2, 4, 8, 16]  # near their cap, not at it: twice as many each time
    assert seen[5] == 32  # 16 streams still ran near their cap: one more probe
    assert seen[6:11] == [16] * 5  # 32 moved no more than 16: back, and 4 uploads held
    assert seen[11] == 24  # then half-way to the N that did not pay
    assert link(16) == rate


def test_clearly_loss_limited_streams_grow_fourfold():
    cap = mathis_mbit(120, 0.5)

    def link(n: int) -> float:
        return min(n * cap * 1.2, 30.0)  # CUBIC beats Reno's cap a little; full at 30

    seen = run(link, 120, 0.5, 6, cold(max_streams=64))
    assert seen[:4] == [1, 4, 16, 64]
    assert seen[4:6] == [16, 16]  # 64 moved no more than 16: back, and held


def test_a_known_rate_seeds_n_from_mathis_in_one_step():
    """With the operator's rate (``link_rate_mbit``), the first loss-limited upload jumps to
    the N that Mathis says fills it: ceil(100 / 1.67) = 60, within max_streams."""
    cap = mathis_mbit(120, 0.5)

    def link(n: int) -> float:
        return min(n * cap * 0.8, 100.0)

    assert run(link, 120, 0.5, 4, cold(max_streams=16), rate_mbit=100.0) == [1, 16, 16, 16]
    assert run(link, 120, 0.5, 3, cold(max_streams=64), rate_mbit=100.0) == [1, 60, 60]


def test_a_probe_that_does_not_pay_goes_back_holds_and_tries_half_way():
    cap = mathis_mbit(120, 0.5)

    def link(n: int) -> float:
        return min(n, 2) * cap * 0.9  # more than two streams add nothing

    config = cold(max_streams=16, hold_transfers=3)
    seen = run(link, 120, 0.5, 12, config)
    assert seen[:4] == [1, 2, 4, 2]
    assert seen[4:7] == [2, 2, 2]  # held
    assert seen[7] == 3  # half-way to the 4 that did not pay
    assert seen[8:12] == [2, 2, 2, 2]  # nor did 3: back, and held
    assert max(seen) <= 16


def test_n_never_exceeds_max_streams():
    seen = run(lambda n: n * mathis_mbit(120, 2.0), 120, 2.0, 20, cold(max_streams=6))
    assert max(seen) == 6
    assert seen[-1] == 6


def test_a_clean_link_stays_on_one_plain_stream():
    seen = run(lambda n: 90.0, 120, 0.0, 8, cold())
    assert seen == [1] * 8
    assert run(lambda n: 90.0, 120, 0.0, 8, cold(), rate_mbit=100.0) == [1] * 8


def test_a_link_far_below_its_known_rate_without_measured_loss_tries_more_streams():
    """Windows or slow start (or loss that 78 probes did not catch: the lab's first round
    on cross-region) hold one stream to 5 of 100 Mbit/s: try the N that carries the rate
    at that, within max_streams; then the path is full (80 %)."""
    seen = run(lambda n: min(5.0 * n, 100.0), 120, 0.0, 5, cold(), rate_mbit=100.0)
    assert seen == [1, 16, 16, 16, 16]
    seen = run(lambda n: min(5.0 * n, 100.0), 120, 0.0, 5, cold(max_streams=4), rate_mbit=100.0)
    assert seen == [1, 4, 4, 4, 4]


def test_bbr_on_both_ends_takes_no_streams_for_loss():
    """Measured on transpacific (1.2 % loss, 250 ms, 50 Mbit/s, BBR both ends): one warm
    stream 38-44 Mbit/s where Mathis allows 0.5; 4 and 16 streams moved no more. With both
    ends on BBR the loss calls for no streams; a known rate it does not fill still does."""
    assert run(lambda n: 40.0, 250, 1.2, 6, cold(), loss_based=False) == [1] * 6

    def transpacific(n: int) -> float:
        return min(28.0 * n**0.5, 95.0)

    assert run(transpacific, 250, 1.2, 3, cold(), 100.0, loss_based=False) == [1, 4, 8]
    # An end that does not say (or runs CUBIC) keeps the loss rule: the probe below.
    assert run(lambda n: 40.0, 250, 1.2, 2, cold()) == [1, 4]


def test_streams_beyond_their_cap_are_probed_and_kept_only_where_they_pay():
    """Streams far beyond their Mathis cap (88 Mbit/s at 0.5 % where it allows 1.7) where
    an end's congestion control is loss-based, or not said: more streams are tried (the
    model cannot say they will not help) and given up when goodput does not grow; a known
    rate that one stream fills takes none."""
    seen = run(lambda n: 88.0, 120, 0.5, 8, cold(hold_transfers=4))
    assert seen == [1, 4, 1, 1, 1, 1, 1, 2]  # 4 paid nothing: back, held, half-way
    assert run(lambda n: 88.0, 120, 0.5, 6, cold(), rate_mbit=100.0) == [1] * 6

    def transpacific(n: int) -> float:  # BBR in loss recovery: more streams pay
        return min(28.0 * n**0.5, 95.0)

    assert run(transpacific, 250, 1.2, 4, cold(), rate_mbit=100.0) == [1, 16, 16, 16]


def test_a_probe_is_judged_once_its_new_connections_are_warm():
    """As measured on cross-region: the first upload on new streams moves what the old N
    did (their TLS, join and slow start), the next ones their share. Judged on the first,
    a probe is given up (``warmup_transfers = 0``); judged on the second, it pays."""
    cap = mathis_mbit(120, 0.5)

    def seen_on(config: StreamsConfig) -> list[int]:
        state, seen = StreamsState(), []
        for _ in range(6):
            before = seen[-1] if seen else state.streams
            seen.append(state.streams)
            goodput = before * cap * 0.7  # each near its cap; new streams carry nothing yet
            state = step(state, goodput, 120, 0.5, config).state
        return seen

    assert seen_on(StreamsConfig()) == [1, 2, 2, 4, 4, 8]
    assert seen_on(cold()) == [1, 2, 1, 1, 1, 1]


def test_a_new_links_cold_first_upload_starts_no_probe():
    """Measured on transpacific (BBR, Top-k): the first upload of a session took 3.8 s, as
    TLS and slow start do, the next ones 1.0 s on one stream. A probe started from the
    first and judged against it always paid, and two of three links kept 4 streams that
    took 1.1-2.3 s. A link starts warming up (``Links.open``), so N moves from the second."""
    cap = mathis_mbit(250, 1.2)
    new = StreamsState(warmup=StreamsConfig().warmup_transfers)
    first = step(new, 4 * cap, 250, 1.2, StreamsConfig(), seconds=3.8)
    assert first.state == StreamsState() and first.reason == "a cold connection's upload"
    assert step(first.state, 4 * cap, 250, 1.2, StreamsConfig(), seconds=3.0).state.streams == 4


def test_a_full_path_takes_no_more_streams():
    cap = mathis_mbit(120, 0.5)
    state = StreamsState(streams=8)
    decision = step(state, 85.0, 120, 0.5, cold(), rate_mbit=100.0)
    assert cap <= 85.0 / 8  # each stream at its cap: loss-limited, but the path is full
    assert decision.state == state and decision.reason == "the path is full"


def test_streams_far_below_their_cap_are_halved_when_goodput_holds():
    state = StreamsState(streams=8)
    config = StreamsConfig()
    decision = step(state, 5.0, 20, 0.01, config)  # cap ~ 70 Mbit/s each, 0.6 used
    assert decision.state.streams == 4
    kept = step(decision.state, 4.9, 20, 0.01, config)
    assert kept.state.streams == 4 and not kept.state.probe_from


def test_nothing_measured_changes_nothing():
    state = StreamsState(streams=4)
    assert step(state, math.nan, 120, 0.5, StreamsConfig()).state == state
    assert step(state, 10.0, math.nan, 0.5, StreamsConfig()).state == state


def test_bad_streams_options_name_the_field():
    with pytest.raises(ValueError, match="max_streams=0"):
        StreamsConfig(max_streams=0)
    with pytest.raises(ValueError, match="idle_frac"):
        StreamsConfig(idle_frac=0.6)


def test_a_links_change_of_n_is_logged_with_its_figures_and_counted_at_the_boundary(caplog):
    """The coordinator's side: uploads on a loss-limited link move its N up, and the round
    boundary logs the change with the figures that chose it, as a codec switch is."""
    links = Links("fp16", PolicyConfig(), MonitorConfig(), [1000], StreamsConfig(max_streams=8))
    ident = Identity(trust_domain="skyfed.local", role="agent", name="aws-1", cloud="aws")
    session = Session(ident, "ipv4:127.0.0.1:1")
    session.stripe_token, session.max_streams = b"t" * 16, 8
    link = links.open(session, 0)
    t0 = time.monotonic()
    link.monitor.add_rtt(t0, 120.0)
    link.monitor.poll(t0 + 10.0)
    link.probe_counts = (1000, 10)  # ~0.5 % one way, as the heartbeats count them
    cap_mbit = mathis_mbit(120.0, link.stream_loss_pct())
    nbytes = int(1.1 * cap_mbit * 1e6 / 8)  # one second at a little over one stream's cap
    link.upload_begins(0, t0 + 50.0)  # the link's first upload, on a cold connection
    link.upload_done(nbytes // 4, t0 + 51.0, connections=1)
    assert links.streams_at_boundary(session) == 1 and session.stream_switches == 0
    link.upload_begins(0, t0 + 100.0)
    link.upload_done(nbytes, t0 + 101.0, connections=1)
    with caplog.at_level("INFO", logger="skyfed.coordinator.links"):
        assert links.streams_at_boundary(session) == 4  # each at its whole cap: 4 x
    assert session.streams == 4 and session.stream_switches == 1
    (line,) = [r.getMessage() for r in caplog.records if "[Coordinator.Streams]" in r.getMessage()]
    assert "from=1 to=4" in line and "rtt_ms=120.0" in line and "loss_pct=0.50" in line
    assert "cap_mbit=1.67" in line and "reason=each stream moves" in line
    for i in (2, 3):  # twice the goodput on 4: the first upload warms the new connections up
        link.upload_begins(i * nbytes, t0 + 100.0 * i)
        link.upload_done(i * nbytes + 2 * nbytes, t0 + 100.0 * i + 1, connections=4)
        assert links.streams_at_boundary(session) == (4 if i == 2 else 8)  # then: kept, 2 x


@pytest.mark.parametrize(
    ("ours", "theirs", "loss_based"),
    [("bbr", "bbr", False), ("bbr", "", True), ("bbr", "cubic", True), ("cubic", "bbr", True)],
)
def test_a_link_is_loss_based_unless_both_ends_run_bbr(ours, theirs, loss_based):
    """The agent's hello says its congestion control, our route says ours: Mathis's cap
    binds the link's streams unless both ignore random loss (an agent from before the
    field says nothing, and is taken as loss-based, as every link was)."""
    links = Links("fp16", PolicyConfig(), MonitorConfig(), [1000], StreamsConfig(max_streams=8))
    ident = Identity(trust_domain="skyfed.local", role="agent", name="aws-1", cloud="aws")
    session = Session(ident, "ipv4:127.0.0.1:1")
    session.cc = CongestionControl(name=ours, source="route")
    session.agent_cc = CongestionControl(name=theirs, source="agent") if theirs else None
    assert links.open(session, 0).loss_based is loss_based


def test_a_first_upload_that_ends_before_the_first_window_still_chooses_n():
    """The lab's first uploads on one stream can end before the monitor's first 2 s window
    closes (the agent's echo that times the link waits behind its chunks): the step goes
    by the latest round trip, not "nothing measured", so the link does not stay on one
    stream a round longer. (The first upload, on a cold connection, starts no probe.)"""
    links = Links("fp32", PolicyConfig(), MonitorConfig(), [1000], StreamsConfig(max_streams=16))
    ident = Identity(trust_domain="skyfed.local", role="agent", name="aws-1", cloud="aws")
    session = Session(ident, "ipv4:127.0.0.1:1")
    session.stripe_token, session.max_streams = b"t" * 16, 16
    link = links.open(session, 0)
    t0 = time.monotonic()
    assert MonitorConfig().window_s > 1.5  # the upload below ends inside the first window
    link.monitor.add_rtt(t0 + 1.2, 120.0)
    link.probe_counts = (40, 0)  # no lost probe yet: the known rate decides
    link.rate_mbit = 100.0
    link.upload_begins(0, t0 + 0.1)
    link.upload_done(1_000_000, t0 + 0.35, connections=1)
    assert links.streams_at_boundary(session) == 1  # warming up
    link.upload_begins(1_000_000, t0 + 0.4)
    link.upload_done(4_600_000, t0 + 1.5, connections=1)  # 26 Mbit/s of 100, 9 round trips
    assert link.monitor.windows == 0
    assert links.streams_at_boundary(session) == 4  # ceil(100 / 26)


def test_an_upload_of_few_chunks_never_probes_more_streams_than_it_has_chunks():
    # Top-k's 0.8 MB upload is one or two chunks: extra streams would only open cold
    # connections (each chunk travels whole on one stream).
    cap = mathis_mbit(255, 1.4)
    state = StreamsState()
    for _ in range(6):
        goodput = 0.9 * cap * state.streams  # loss-limited: each stream adds its cap
        state = step(state, goodput, 255, 1.4, cold(), chunks=2).state
        assert state.streams <= 2
    assert state.streams == 2  # loss-limited: as many as the chunks


def test_a_link_on_more_streams_than_its_upload_has_chunks_steps_down_at_once():
    # A switch to a sparser codec: 16 streams, then uploads of 3 chunks.
    decision = step(StreamsState(streams=16), 5.0, 120, 0.5, cold(), chunks=3)
    assert decision.state == StreamsState(streams=3)
    assert "3 chunks" in decision.reason
    # min_streams still holds, and an unknown count (0) bounds nothing.
    assert (
        step(StreamsState(streams=16), 5.0, 120, 0.5, cold(min_streams=4), chunks=1).state.streams
        == 4
    )
    assert step(StreamsState(streams=16), 5.0, 120, 0.5, cold(), chunks=0).state.streams == 16


def test_an_upload_of_a_few_round_trips_probes_no_more_streams():
    # Top-k's 0.8 MB in 0.6 s at 255 ms is slow start, whatever Mathis's cap says; the
    # same goodput over 3 s (12 round trips) is a stream at its cap.
    cap = mathis_mbit(255, 1.4)
    short = step(StreamsState(), 4 * cap, 255, 1.4, cold(), seconds=0.6)
    assert short.state.streams == 1 and "slow start" in short.reason
    assert step(StreamsState(), 4 * cap, 255, 1.4, cold(), seconds=3.0).state.streams == 4
    assert (
        step(
            StreamsState(), 4 * cap, 255, 1.4, cold(min_transfer_rtts=0), seconds=0.6
        ).state.streams
        == 4
    )

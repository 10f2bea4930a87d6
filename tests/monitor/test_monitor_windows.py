"""The link monitor: windows, EWMA, jitter, loss estimation, goodput, bounded raw samples."""

from __future__ import annotations

import math
import random

import pytest

from skyfed.compression.monitor import LinkMonitor, MonitorConfig, jitter_of, one_way_loss_pct


def feed_rtts(monitor: LinkMonitor, start_s: float, rtts_ms: list[float], width_s: float) -> None:
    for i, rtt in enumerate(rtts_ms):
        monitor.add_rtt(start_s + width_s * i / len(rtts_ms), rtt)


def test_a_window_reports_the_median_so_one_stalled_round_trip_does_not_move_it():
    monitor = LinkMonitor(MonitorConfig(window_s=1.0), start_s=0.0)
    feed_rtts(monitor, 0.0, [20.0] * 9 + [900.0], 1.0)
    (window,) = monitor.poll(1.0)
    assert window.rtt_ms == 20.0
    assert monitor.stats().rtt_ms == 20.0


def test_ewma_weights_the_newest_window_by_alpha():
    monitor = LinkMonitor(MonitorConfig(window_s=1.0, alpha=0.25), start_s=0.0)
    for second, rtt in enumerate([100.0, 200.0, 200.0]):
        monitor.add_rtt(second + 0.5, rtt)
        monitor.poll(second + 1.0)
    expected = 100.0
    for rtt in (200.0, 200.0):
        expected = 0.25 * rtt + 0.75 * expected
    assert monitor.stats().rtt_ms == pytest.approx(expected)
    assert monitor.stats().windows == 3


def test_windows_close_only_when_their_time_is_up_and_empty_ones_change_nothing():
    monitor = LinkMonitor(MonitorConfig(window_s=2.0), start_s=10.0)
    monitor.add_rtt(10.5, 50.0)
    assert monitor.poll(11.9) == []
    assert len(monitor.poll(12.0)) == 1
    assert len(monitor.poll(18.5)) == 3  # three empty windows
    assert monitor.stats().rtt_ms == 50.0


def test_jitter_is_the_mean_absolute_difference_of_consecutive_round_trips():
    assert jitter_of([10.0, 12.0, 9.0, 9.0]) == pytest.approx((2 + 3 + 0) / 3)
    assert math.isnan(jitter_of([10.0]))
    monitor = LinkMonitor(MonitorConfig(window_s=1.0, alpha=1.0), start_s=0.0)
    feed_rtts(monitor, 0.0, [100.0, 110.0] * 10, 1.0)
    monitor.poll(1.0)
    assert monitor.stats().jitter_ms == pytest.approx(10.0)


def test_one_way_loss_comes_from_round_trip_loss_with_both_directions_alike():
    assert one_way_loss_pct(1000, 0) == 0.0
    # 1 % each way: a round trip survives with 0.99 ** 2.
    assert one_way_loss_pct(10_000, 10_000 * (1 - 0.99**2)) == pytest.approx(1.0)
    assert math.isnan(one_way_loss_pct(0, 0))


def test_loss_estimate_from_simulated_probes_is_within_the_binomial_bound():
    rng = random.Random(7)
    monitor = LinkMonitor(MonitorConfig(window_s=1.0, loss_alpha=0.3), start_s=0.0)
    p, per_window = 0.03, 50
    for second in range(200):
        lost = sum(rng.random() > (1 - p) ** 2 for _ in range(per_window))
        monitor.add_probes(second + 0.5, per_window, lost)
        monitor.poll(second + 1.0)
    # The EWMA over counts covers about (2 - a) / a = 5.7 windows: ~280 probes, so the
    # round-trip loss (5.9 %) has a standard error near 1.4 %, i.e. ~0.75 % one way.
    assert monitor.stats().loss_pct == pytest.approx(3.0, abs=2.0)


def test_goodput_is_bytes_over_seconds_of_real_transfers_and_small_ones_are_ignored():
    monitor = LinkMonitor(MonitorConfig(window_s=1.0, min_goodput_bytes=1000), start_s=0.0)
    monitor.add_transfer(0.2, 1_000_000, 0.08)  # 100 Mbit/s
    monitor.add_transfer(0.4, 500, 0.5)  # too small to say anything about rate
    monitor.poll(1.0)
    assert monitor.stats().goodput_mbit == pytest.approx(100.0)
    assert len(monitor.transfer_samples) == 1


def test_goodput_keeps_the_rtt_it_was_measured_at():
    monitor = LinkMonitor(MonitorConfig(window_s=1.0, alpha=1.0), start_s=0.0)
    monitor.add_rtt(0.1, 20.0)
    monitor.add_transfer(0.2, 1_000_000, 0.08)
    monitor.poll(1.0)
    monitor.add_rtt(1.5, 300.0)  # the link turned far; nothing large enough was sent since
    monitor.poll(2.0)
    stats = monitor.stats()
    assert (stats.rtt_ms, stats.goodput_mbit, stats.goodput_rtt_ms) == (300.0, 100.0, 20.0)
    assert monitor.latest().goodput_rtt_ms == 20.0


def test_raw_samples_are_kept_for_plots_but_bounded():
    monitor = LinkMonitor(MonitorConfig(window_s=1.0, max_samples=16), start_s=0.0)
    for i in range(100):
        monitor.add_rtt(i / 100, float(i))
    assert len(monitor.rtt_samples) == 16
    assert monitor.rtt_samples[-1] == (0.99, 99.0)


@pytest.mark.parametrize(("field", "value"), [("window_s", 0), ("alpha", 0), ("alpha", 1.5)])
def test_bad_monitor_option_names_field_and_value(field, value):
    with pytest.raises(ValueError, match=f"{field}={value!r}"):
        MonitorConfig(**{field: value})

"""A link's exchange against its floor, and the limit named when it is far above
(``coordinator/efficiency.py``)."""

from __future__ import annotations

import math

import pytest

from skyfed.coordinator.efficiency import Exchange, assess, floor_s


def exchange(up_s: float, down_s: float, *, codec_s: float = 0.0, streams: int = 1) -> Exchange:
    # The cross-region Top-k exchange: 0.84 MB up, 2.25 MB down.
    return Exchange(
        round=3,
        up_s=up_s,
        down_s=down_s,
        codec_s=codec_s,
        bytes_up=840_000,
        bytes_down=2_250_000,
        streams=streams,
    )


def test_the_floor_is_a_round_trip_plus_the_bytes_at_the_rate():
    assert floor_s(120, 3_090_000, 100) == pytest.approx(0.12 + 0.2472)
    assert math.isnan(floor_s(120, 1, 0))


def test_one_loss_limited_stream_is_named_as_the_limit():
    e = assess(exchange(5.0, 10.6), rtt_ms=120, loss_pct=0.5, rate_mbit=100, max_streams=16)
    assert e.ratio == pytest.approx(15.6 / 0.3672, rel=1e-3)  # the 42x
    assert e.limit.startswith("loss-limited streams: 1 x 1.7 Mbit/s")


def test_a_lossy_link_with_bbr_on_both_ends_names_loss_recovery_not_mathis():
    e = assess(
        exchange(5.0, 10.6),
        rtt_ms=120,
        loss_pct=0.5,
        rate_mbit=100,
        max_streams=16,
        loss_based=False,
    )
    assert e.limit.startswith("loss recovery: 1.6 Mbit/s over 1 stream(s) at 0.50 % loss")


def test_an_exchange_near_its_floor_names_no_limit():
    e = assess(
        exchange(0.2, 0.3, streams=16), rtt_ms=120, loss_pct=0.5, rate_mbit=100, max_streams=16
    )
    assert e.ratio < 1.5
    assert e.limit == ""


def test_codec_time_and_round_trips_are_told_apart():
    slow_codec = assess(
        exchange(1.0, 2.0, codec_s=2.0), rtt_ms=120, loss_pct=0, rate_mbit=100, max_streams=16
    )
    assert slow_codec.limit.startswith("codec CPU")
    tiny = Exchange(round=1, up_s=0.2, down_s=0.2, codec_s=0, bytes_up=10, bytes_down=10, streams=1)
    chatty = assess(tiny, rtt_ms=120, loss_pct=0, rate_mbit=100, max_streams=16)
    assert chatty.limit.startswith("round trips")


def test_a_clean_link_far_from_its_floor_points_at_windows():
    e = assess(exchange(1.0, 1.0), rtt_ms=120, loss_pct=0.0, rate_mbit=100, max_streams=16)
    assert e.limit.startswith("window or slow start")

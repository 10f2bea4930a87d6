"""What a service reports about its connections' congestion control, and when it warns."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from skyfed.netinfo import (
    STRIPED_NOTSENT_LOWAT,
    CongestionControl,
    congestion_control,
    loss_cap_warning,
    mathis_mbit,
    notsent_lowat,
    notsent_lowat_warning,
    peer_host,
)


def test_without_a_route_metric_the_host_default_is_reported() -> None:
    cc = congestion_control("127.0.0.1")  # loopback carries no congctl metric
    assert cc.source == "host"
    assert cc.name == Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()


def test_mathis_holds_one_stream_to_a_few_mbit_at_120_ms_and_half_a_percent() -> None:
    assert mathis_mbit(120.0, 0.5) == pytest.approx(1.67, abs=0.01)
    assert mathis_mbit(120.0, 0.0) == float("inf")


def test_cubic_on_a_lossy_link_warns_and_bbr_or_a_clean_link_does_not() -> None:
    cubic = CongestionControl(name="cubic", source="host")
    text = loss_cap_warning(cubic, rtt_ms=120.0, loss_pct=0.5, rate_mbit=100.0)
    assert text is not None and "1.7 Mbit/s of 100" in text and "bbr" in text
    bbr = CongestionControl(name="bbr", source="route")
    assert loss_cap_warning(bbr, rtt_ms=120.0, loss_pct=0.5, rate_mbit=100.0) is None
    assert loss_cap_warning(cubic, rtt_ms=120.0, loss_pct=0.0, rate_mbit=100.0) is None
    assert loss_cap_warning(cubic, rtt_ms=1.0, loss_pct=0.01, rate_mbit=100.0) is None


def test_a_grpc_peer_string_names_its_address() -> None:
    assert peer_host("ipv4:10.77.1.2:54321") == "10.77.1.2"
    assert peer_host("ipv6:[::1]:7443") == "::1"
    assert peer_host("unix:/tmp/sock") == "unix:/tmp/sock"
    assert congestion_control(None).source == "host"


def test_a_links_loss_capped_cubic_is_warned_about_once(caplog):
    from skyfed.certs.identity import Identity
    from skyfed.compression.monitor import MonitorConfig
    from skyfed.compression.policy import PolicyConfig
    from skyfed.coordinator.links import Links
    from skyfed.coordinator.session import Session

    links = Links("fp16", PolicyConfig(), MonitorConfig(), [10])
    session = Session(Identity.agent("skyfed.local", "aws", "aws-1"), "ipv4:127.0.0.1:1")
    session.cc = CongestionControl(name="cubic", source="host")
    links.open(session, 0)
    caplog.set_level(logging.WARNING, logger="skyfed.coordinator.links")
    for _ in range(3):
        links.warn_if_loss_capped(session, rtt_ms=120.0, loss_pct=0.5, rate_mbit=100.0)
    warned = [r.getMessage() for r in caplog.records if "give the hosts BBR" in r.getMessage()]
    assert len(warned) == 1 and "aws-1" in warned[0]
    bbr = Session(Identity.agent("skyfed.local", "gcp", "gcp-1"), "ipv4:127.0.0.1:2")
    bbr.cc = CongestionControl(name="bbr", source="route")
    links.open(bbr, 0)
    links.warn_if_loss_capped(bbr, rtt_ms=120.0, loss_pct=0.5, rate_mbit=100.0)
    assert not [r for r in caplog.records if "gcp-1" in r.getMessage()]


def test_a_striping_host_without_a_bound_on_unsent_socket_data_is_warned() -> None:
    unlimited = 4294967295  # the kernel's default
    text = notsent_lowat_warning(unlimited)
    assert text is not None and f"tcp_notsent_lowat is {unlimited}" in text
    assert str(STRIPED_NOTSENT_LOWAT) in text and "docs/striping.md" in text
    assert notsent_lowat_warning(STRIPED_NOTSENT_LOWAT) is None
    assert notsent_lowat_warning(None) is None  # not Linux: nothing to say


def test_the_send_buffer_warning_waits_for_a_striped_session(caplog, monkeypatch) -> None:
    """At start a service only logs the value; it warns once a session stripes (a local
    demo whose links never stripe needs no sysctl)."""
    import skyfed.netinfo as netinfo

    monkeypatch.setattr(netinfo, "notsent_lowat", lambda: 4294967295)
    caplog.set_level(logging.INFO, logger="skyfed.netinfo")
    assert netinfo.log_send_buffering("coordinator", striping=False) == 4294967295
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    netinfo.log_send_buffering("coordinator", striping=True)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "tcp_notsent_lowat" in warned[0]


def test_the_hosts_notsent_lowat_is_read_from_proc() -> None:
    path = Path("/proc/sys/net/ipv4/tcp_notsent_lowat")
    assert notsent_lowat() == int(path.read_text())

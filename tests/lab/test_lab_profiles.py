"""Profiles, schedules, the loss bound and tc command lines: no root needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyfed.lab.container import ingress_redirect_commands
from skyfed.lab.profiles import DOWN, LinkProfile, Schedule, load_catalog
from skyfed.lab.selfcheck import CheckSettings, binomial_interval
from skyfed.lab.shapers import netem_commands

ISSUE_RTTS_MS = {
    "lan": 1,
    "intra-region": 20,
    "cross-region": 120,
    "transpacific": 250,
    "lossy": 80,
    "far-clean": 120,
    "gigabit-50ms": 50,
}


def test_shipped_profiles_match_the_named_link_types() -> None:
    catalog = load_catalog()
    assert {n: p.rtt_ms for n, p in catalog.profiles.items()} == ISSUE_RTTS_MS
    cross, pacific = catalog.profile("cross-region"), catalog.profile("transpacific")
    assert (cross.loss_pct, cross.rate_mbit) == (0.5, 100)
    assert (pacific.loss_pct, pacific.rate_mbit) == (1.2, 50)
    assert catalog.profile("lossy").loss_pct == 3.0


def test_every_profile_is_offered_with_cubic_and_with_bbr() -> None:
    catalog = load_catalog()
    for name, profile in catalog.profiles.items():
        assert profile.congestion == "cubic"
        bbr = catalog.profile(f"{name}+bbr")
        assert (bbr.name, bbr.congestion, bbr.rtt_ms) == (f"{name}+bbr", "bbr", profile.rtt_ms)
        assert catalog.profile(f"{name}+cubic").congestion == "cubic"
    with pytest.raises(KeyError, match="NAME\\+CC"):
        catalog.profile("lan+vegas")


def test_every_shipped_schedule_names_known_profiles() -> None:
    catalog = load_catalog()
    assert catalog.schedules
    for schedule in catalog.schedules.values():
        for step in schedule.steps:
            assert step.profile == DOWN or step.profile in catalog.profiles


def test_unknown_profile_is_refused_with_the_known_names() -> None:
    with pytest.raises(KeyError, match="cross-region"):
        load_catalog().profile("moon")


@pytest.mark.parametrize(
    ("field", "value"), [("rtt_ms", -1.0), ("loss_pct", 100.0), ("rate_mbit", float("nan"))]
)
def test_invalid_profile_names_the_field(field: str, value: float) -> None:
    kwargs = {"name": "x", "rtt_ms": 10.0, field: value}
    with pytest.raises(ValueError, match=field):
        LinkProfile(**kwargs)  # type: ignore[arg-type]


def test_edited_profiles_file_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[profiles.moon]\nrtt_ms = 2500.0\nloss_pct = 1.0\nrate_mbit = 2\n")
    assert load_catalog(path).profile("moon").delay_ms == 1250.0


def test_partition_schedule_goes_down_then_back_to_its_base() -> None:
    catalog = load_catalog()
    base = catalog.profile("cross-region")
    steps = Schedule.partition("cross-region", 7.0).steps
    resolved = [catalog.resolve(s, base) for s in steps]
    assert [p.down for p in resolved] == [False, True, False]
    assert resolved[1].loss == 1.0 and steps[1].hold_s == 7.0
    assert resolved[2] == base


def test_binomial_interval_is_exact_and_two_sided() -> None:
    assert binomial_interval(2000, 0.0, 1e-4) == (0, 0)
    lo, hi = binomial_interval(2000, 0.01, 1e-4)
    assert 3 <= lo <= 8 and 35 <= hi <= 40
    assert lo < 20 < hi


def test_check_settings_validate() -> None:
    with pytest.raises(ValueError, match="probes"):
        CheckSettings(probes=10)


def test_netem_commands_shape_delay_jitter_loss_and_rate() -> None:
    commands = netem_commands("eth0", load_catalog().profile("transpacific"))
    netem, tbf = (" ".join(c) for c in commands)
    assert netem.startswith("tc qdisc replace dev eth0 root handle 1: netem")
    assert "delay 125ms 5ms distribution normal" in netem and "loss 1.2%" in netem
    assert "parent 1:1 handle 10: tbf rate 50mbit" in tbf


def test_netem_commands_for_a_partition_drop_everything() -> None:
    (netem,) = netem_commands("eth0", load_catalog().profile("lan").as_down())
    assert netem[-2:] == ["loss", "100%"]


def test_container_ingress_goes_through_ifb() -> None:
    commands = [" ".join(c) for c in ingress_redirect_commands("eth0")]
    assert commands[0] == "ip link add ifb0 type ifb"
    assert commands[-1].endswith("mirred egress redirect dev ifb0")

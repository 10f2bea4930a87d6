"""The monitor and the link policy over real shaped links (network namespaces, as root).

Short windows and dwell (0.5 s, 2 windows), 100 ms heartbeats and 5 ms probes keep these
runs to tens of seconds; the decisions are the production code's, only faster.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from skyfed.lab.federation import Federation, FederationSpec
from skyfed.lab.profiles import LinkProfile, Schedule, ScheduleStep, load_catalog
from skyfed.lab.topology import COORDINATOR, AgentSpec, Lab, LabSpec

pytestmark = pytest.mark.lab

SWITCH = re.compile(r"\[Coordinator\.Codec\] agent=\S+/agent/(\S+) from=(\S+) to=(\S+)")
CLOSED = re.compile(r"\[Coordinator\.Round\] round=(\d+) closed")
FAST_MONITOR = """
[monitor]
window_s = 0.5
loss_alpha = {loss_alpha}

[policy]
heavier_after_windows = 2
lighter_after_windows = 2
"""
EXTRA_PROFILES = (
    LinkProfile(name="rtt20", rtt_ms=20.0, jitter_ms=0.5),
    LinkProfile(name="rtt150", rtt_ms=150.0, jitter_ms=1.0),
    LinkProfile(name="rtt300", rtt_ms=300.0, jitter_ms=1.0),
    # Round trips straddle the 200 ms threshold. The shaper never reorders, so jitter also
    # lifts the median a little (about +2 ms per ms of jitter with 5 ms probes).
    LinkProfile(name="rtt200-jitter", rtt_ms=193.0, jitter_ms=4.0),
    LinkProfile(name="loss1", rtt_ms=10.0, loss_pct=1.0),
    LinkProfile(name="loss3", rtt_ms=10.0, loss_pct=3.0),
)


@functools.cache
def _unavailable() -> str | None:
    from skyfed.lab.netns import why_unavailable

    return why_unavailable()


def _lab(**agents: str) -> Lab:
    """A lab with the extra profiles: ``_lab(aws_1="lan", ...)``."""
    catalog = load_catalog()
    catalog.profiles.update({p.name: p for p in EXTRA_PROFILES})
    specs = tuple(AgentSpec(name=n.replace("_", "-"), profile=p) for n, p in agents.items())
    return Lab(spec=LabSpec(agents=specs), catalog=catalog).__enter__()


@pytest.fixture
def lab_of(tmp_path: Path) -> Iterator[Callable[..., Lab]]:
    """``lab_of(aws_1="lan", ...)``: a lab with the extra profiles, torn down after the test."""
    if _unavailable():
        pytest.skip(_unavailable())
    labs: list[Lab] = []

    def build(**agents: str) -> Lab:
        labs.append(_lab(**agents))
        return labs[-1]

    yield build
    for lab in labs:
        lab.close()


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Federation, Path, float]]:
    """One federation for the two tests that watch links for tens of seconds (one run, not
    two: ~30 s of the suite). aws-1's RTT moves 20 -> 150 -> 300 -> 20 ms, gcp-1's sits on
    200 ms with jitter, azure-1 and aws-2 lose 1 and 3 %. ``loss_alpha`` 0.05 lets the loss
    estimate span ~39 windows of ~100 probes; the RTT has its own alpha, so the RTT links
    switch as they would at the default. Yields the federation, its directory and when it
    started (monotonic s)."""
    if _unavailable():
        pytest.skip(_unavailable())
    tmp = tmp_path_factory.mktemp("watched")
    lab = _lab(aws_1="rtt20", gcp_1="rtt200-jitter", azure_1="loss1", aws_2="loss3")
    try:
        fed = start(lab, tmp, rounds=1000, loss_alpha=0.05)
        started = time.monotonic()
        steps = [
            ScheduleStep(profile=p, hold_s=7.0) for p in ("rtt20", "rtt150", "rtt300", "rtt20")
        ]
        lab.run_schedule("aws-1", Schedule(name="20-150-300-20", steps=tuple(steps)))
        yield fed, tmp, started
    finally:
        lab.close()


def start(lab: Lab, tmp: Path, rounds: int, loss_alpha: float = 0.3) -> Federation:
    config = tmp / "coordinator.toml"
    config.write_text(FAST_MONITOR.format(loss_alpha=loss_alpha))
    args = ("--config", str(config), "--heartbeat-ms", "100", "--probe-interval-ms", "5")
    args += ("--status-file", str(tmp / "status.json"))
    spec = FederationSpec(rounds=rounds, round_deadline_s=60.0, coordinator_args=args)
    fed = Federation(lab, spec, tmp)
    fed.start()
    return fed


def events(fed: Federation) -> list[tuple[str, ...]]:
    """Codec switches ("switch", agent, from, to) and round ends ("round", n), in log order."""
    text = fed.log(COORDINATOR).read_text() if fed.log(COORDINATOR).exists() else ""
    out: list[tuple[str, ...]] = []
    for line in text.splitlines():
        if m := SWITCH.search(line):
            out.append(("switch", *m.groups()))
        elif m := CLOSED.search(line):
            out.append(("round", m.group(1)))
    return out


def switches(fed: Federation, agent: str) -> list[str]:
    return [e[3] for e in events(fed) if e[0] == "switch" and e[1] == agent]


def logs(fed: Federation) -> str:
    return "\n".join(f"--- {h}\n{fed.tail(h, 15)}" for h in (COORDINATOR, *fed.agents))


def test_each_profile_settles_on_its_codec_in_one_run_and_agents_end_identical(
    lab_of: Callable[..., Lab], tmp_path: Path
) -> None:
    lab = lab_of(aws_1="lan", gcp_1="cross-region", azure_1="transpacific")
    # Settled within 3 rounds (asserted below); 6 leave the last switch room to be late.
    fed = start(lab, tmp_path, rounds=6)
    codes = fed.wait(timeout_s=150)
    assert all(code == 0 for code in codes.values()), f"{codes}\n{logs(fed)}"
    reports = fed.reports()
    assert len({r["weights_digest"] for r in reports.values()}) == 1, reports
    expected = {"aws-1": "fp16", "gcp-1": "topk", "azure-1": "ecsgd"}
    assert {name: r["codec"] for name, r in reports.items()} == expected, logs(fed)
    for agent, codec in expected.items():
        assert switches(fed, agent) == ([] if codec == "fp16" else [codec]), events(fed)
    last_switch = max(i for i, e in enumerate(events(fed)) if e[0] == "switch")
    rounds_before = sum(1 for e in events(fed)[:last_switch] if e[0] == "round")
    print(f"settled after {rounds_before} rounds: {events(fed)}")
    assert rounds_before <= 3


def test_a_changing_link_switches_once_per_change_and_jitter_does_not_flap(
    watched: tuple[Federation, Path, float],
) -> None:
    fed, tmp, _ = watched
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and len(switches(fed, "aws-1")) < 3:
        time.sleep(0.5)
    time.sleep(3.0)  # room for a spurious extra switch to show
    print(events(fed))
    assert switches(fed, "aws-1") == ["topk", "ecsgd", "fp16"], logs(fed)
    # 200 ms +- jitter sits on the topk/ecsgd threshold: it moves off fp16 once, then stays.
    assert switches(fed, "gcp-1") == ["topk"], logs(fed)
    status = json.loads((tmp / "status.json").read_text())
    (jittery,) = [a for a in status["agents"] if a["name"] == "gcp-1"]
    print(f"jittery link: rtt_ms={jittery['rttMs']:.1f} jitter_ms={jittery['jitterMs']:.1f}")
    assert 190 <= jittery["rttMs"] <= 215 and jittery["jitterMs"] >= 2


def test_measured_loss_on_one_and_three_percent_links_is_within_the_bound(
    watched: tuple[Federation, Path, float],
) -> None:
    fed, tmp, started = watched
    time.sleep(max(0.0, started + 25 - time.monotonic()))
    status = json.loads((tmp / "status.json").read_text())
    measured = {a["name"]: a.get("lossPct", 0.0) for a in status["agents"]}
    print(f"measured one-way loss: {measured}")
    # The monitor's loss is an EWMA of 2 s windows' probe counts (loss_alpha 0.3), worth
    # (2 - a) / a = 5.7 windows of ~300 round-trip probes, not all ~3900 sent: 4 standard
    # errors of its one-way estimate are 0.68 points at 1 % and 1.18 at 3 % (the bound
    # once taken from all 3900, 0.8, failed a suite run at 2.17 % against 3 %).
    assert measured["azure-1"] == pytest.approx(1.0, abs=0.7), logs(fed)
    assert measured["aws-2"] == pytest.approx(3.0, abs=1.2), logs(fed)
    assert measured["aws-2"] > measured["azure-1"], logs(fed)

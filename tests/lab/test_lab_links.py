"""Shaped links measure up to their profiles; partitions, schedules and teardown behave."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from skyfed.lab.netns import ETC_NETNS, Namespace, list_namespaces, reap_stale
from skyfed.lab.profiles import Schedule, ScheduleStep, load_catalog
from skyfed.lab.selfcheck import CheckSettings, LinkCheckError, check_lab, measure_link
from skyfed.lab.topology import AgentSpec, Lab, LabSpec

pytestmark = pytest.mark.lab

QUICK = CheckSettings(probes=300, interval_ms=1.0)
"""Enough probes for RTT; the loss bound is only exercised by the full self-check."""


@pytest.mark.parametrize("profile", sorted(load_catalog().profiles))
def test_link_self_check_passes_for_every_named_profile(
    make_lab: Callable[..., Lab], profile: str
) -> None:
    lab = make_lab(f"aws-1={profile}")
    (report,) = check_lab(lab)
    assert report.ok, report.summary()
    assert report.mechanism == lab.mechanism
    print(report.summary())


def test_link_that_does_not_match_its_profile_fails_with_the_measured_figures(
    make_lab: Callable[..., Lab],
) -> None:
    lab = make_lab("aws-1=cross-region")
    claimed = load_catalog().profile("intra-region")
    report = measure_link(lab, "aws-1", QUICK, expected=claimed)
    assert not report.ok
    assert 108 <= report.rtt_measured_ms <= 132
    with pytest.raises(LinkCheckError, match=r"rtt 1\d\d\.\d\d ms, profile 20 ms"):
        raise LinkCheckError([report])


def test_partition_drops_everything_then_the_link_heals(make_lab: Callable[..., Lab]) -> None:
    lab = make_lab("aws-1=lan", "gcp-1=lan")
    runner = lab.partition("aws-1", down_s=2.5)
    time.sleep(0.2)
    down = measure_link(lab, "aws-1", CheckSettings(probes=200, interval_ms=1.0))
    other = measure_link(lab, "gcp-1", QUICK)
    assert down.probes_lost == down.probes == 200
    assert other.ok, other.summary()
    runner.join(timeout=10)
    assert [down for _, _, down in runner.applied] == [False, True, False]
    # Healed means every probe comes back; how close its RTT is to the profile is the profile
    # tests' business (a loaded host's userspace delay adds milliseconds to a 1 ms link).
    healed = measure_link(lab, "aws-1", QUICK)
    assert healed.probes_lost == 0 < healed.probes, healed.summary()


def test_schedule_changes_the_link_profile_during_a_run(make_lab: Callable[..., Lab]) -> None:
    lab = make_lab("aws-1=lan")
    steps = (ScheduleStep(profile="lan", hold_s=0.5), ScheduleStep(profile="lossy", hold_s=30))
    runner = lab.run_schedule("aws-1", Schedule(name="worsen", steps=steps))
    time.sleep(0.8)
    report = measure_link(lab, "aws-1", QUICK)
    assert report.profile == "lossy"
    assert abs(report.rtt_measured_ms - 80) <= 8, report.summary()
    runner.stop()
    assert [name for _, name, _ in runner.applied] == ["lan", "lossy"]


def test_teardown_leaves_no_namespace_process_or_file(make_lab: Callable[..., Lab]) -> None:
    lab = make_lab("aws-1=cross-region", "gcp-1=lan")
    sleeper = lab.spawn("aws-1", ["sleep", "600"])
    forwarders = [link._proc.pid for link in lab.links.values() if hasattr(link, "_proc")]
    names = [ns.name for ns in lab.hosts.values()]
    lab.close()
    assert not set(names) & set(list_namespaces())
    assert not any((ETC_NETNS / n).exists() for n in names)
    assert sleeper.popen.poll() is not None
    for pid in forwarders:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)


def test_a_failing_test_body_still_tears_down(lab_host: None) -> None:
    lab = Lab(spec=LabSpec(agents=(AgentSpec(name="aws-1"),)))
    with pytest.raises(ZeroDivisionError), lab:
        assert len([ns for ns in list_namespaces() if ns.startswith(lab.prefix)]) == 2
        _ = 1 / 0
    assert not [ns for ns in list_namespaces() if ns.startswith(lab.prefix)]


def test_stale_namespaces_of_a_dead_owner_are_reaped(lab_host: None) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = Namespace(f"sfl-{dead.pid}-0-coordinator")
    stale.create()
    mine = Namespace(f"sfl-{os.getpid()}-999-coordinator")
    mine.create()
    try:
        assert stale.name in reap_stale()
        assert stale.name not in list_namespaces() and mine.name in list_namespaces()
    finally:
        stale.delete()
        mine.delete()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_lab_up_tears_down_on_ctrl_c_and_sigterm(lab_host: None, sig: signal.Signals) -> None:
    argv = [sys.executable, "-m", "skyfed.lab", "up", "--agent", "aws-1=lan", "--no-check"]
    # Started with SIGINT ignored, as a shell starts a background job: Ctrl-C still works.
    ignore_sigint = functools.partial(signal.signal, signal.SIGINT, signal.SIG_IGN)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, preexec_fn=ignore_sigint)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(4)]
    assert lines[0].startswith("mechanism: "), lines
    mine = [ns for ns in list_namespaces() if ns.startswith(f"sfl-{proc.pid}-")]
    assert len(mine) == 2
    proc.send_signal(sig)
    proc.wait(timeout=20)
    proc.stdout.close()
    assert not [ns for ns in list_namespaces() if ns.startswith(f"sfl-{proc.pid}-")]


def _is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] == "Z"

"""Fixtures for the network lab tests: skip only where a lab cannot run at all."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest

from skyfed.lab.netns import list_namespaces
from skyfed.lab.selfcheck import CheckSettings, LinkCheckError, measure_link
from skyfed.lab.topology import AgentSpec, Lab, LabSpec

PRE_CHECK = CheckSettings(probes=1000, rate_duration_s=0.5, rtt_tolerance=0.25)
"""How a test that trains over the lab checks its links first. 1,000 probes still bound
the loss away from none on every lossy profile (0.5 %: 1-24 round trips lost). RTT may be
a quarter off: a loaded CI host once added 2.5 ms to a 20 ms delay line. The figures'
accuracy is tests/lab/test_lab_links.py's job; these tests pin what the federation does."""


@functools.cache
def _unavailable() -> str | None:
    from skyfed.lab.netns import why_unavailable

    return why_unavailable()


@pytest.fixture
def lab_host() -> None:
    """Skip (with the reason) where this host cannot build a lab: not root, no netns."""
    reason = _unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def make_lab(lab_host: None) -> Iterator[Callable[..., Lab]]:
    """Build labs that are torn down when the test ends, pass or fail, and leave nothing."""
    labs: list[Lab] = []

    def build(*agents: str, **kwargs: object) -> Lab:
        specs = tuple(
            AgentSpec(name=n, profile=p) for n, _, p in (a.partition("=") for a in agents)
        )
        lab = Lab(spec=LabSpec(agents=specs, **kwargs))  # type: ignore[arg-type]
        labs.append(lab)
        return lab.__enter__()

    yield build
    for lab in labs:
        lab.close()
        assert not [ns for ns in list_namespaces() if ns.startswith(lab.prefix)]


@pytest.fixture
def pre_check() -> Callable[..., None]:
    """``pre_check(lab)``: measure every link before a test trusts it; raise
    ``LinkCheckError`` for one that misses its profile twice in a row.

    A link that misses once is measured again: a stall of the host (a rate test read 70 of
    100 Mbit/s with no drops in one full run of the suite) must not fail a test of
    training, while a link built wrong misses every time. The link self-check itself
    (``check_lab``) never measures twice.
    """

    def check(lab: Lab, settings: CheckSettings = PRE_CHECK) -> None:
        for agent in lab.links:
            report = measure_link(lab, agent, settings)
            if not report.ok:
                print(f"measuring again: {report.summary()}")
                report = measure_link(lab, agent, settings)
            print(report.summary())
            if not report.ok:
                raise LinkCheckError([report])

    return check

"""Fixtures for the network lab tests: skip only where a lab cannot run at all."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest

from skyfed.lab.netns import list_namespaces
from skyfed.lab.topology import AgentSpec, Lab, LabSpec


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

"""The real commands on striped sessions: three agents, each on three TLS connections,
train and end bit-identical (the daemon, its link and its stripes together)."""

from __future__ import annotations

import pytest

from ..e2e.test_federation_processes import (
    CLOUDS,
    assert_identical,
    finish,
    start_agent,
    start_coordinator,
    work,  # noqa: F401 (a fixture)
)

pytestmark = pytest.mark.multiprocess


def test_three_agents_on_three_striped_connections_each_train_and_end_identical(reaped, work):  # noqa: F811
    config = work / "coordinator.toml"
    config.write_text("[streams]\nmin_streams = 3\nmax_streams = 3\n")
    port = start_coordinator(reaped, work, rounds=4, **{"--config": config})
    for i, cloud in enumerate(CLOUDS):
        start_agent(reaped, work, port, cloud, i)
    status = finish(reaped, work)
    assert_identical(work, status, 4)
    assert reaped.log("coordinator").count("[Federation.Stripe] agent=") == 2 * len(CLOUDS)
    timed = [link for r in status["rounds"] for link in r["links"]]
    assert timed and {link["streams"] for link in timed} == {3}, timed

"""Fixtures of the deployment tests: a real single-node Slurm cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .slurm_cluster import SlurmCluster


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd started for this session, stopped after it."""
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

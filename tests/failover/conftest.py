"""A real etcd per test (Debian's etcd-server), stopped whatever the outcome."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from skyfed.coordinator.replicas.testing import EtcdServer


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path / "etcd")
    try:
        yield server
    finally:
        server.stop()

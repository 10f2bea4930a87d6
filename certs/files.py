"""Permission-correct writes so a reader never sees half a key, cert or CRL."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from skyfed.files import PRIVATE_MODE, write_atomic

DIRECTORY_MODE = 0o700
LOCK_FILE = ".lock"


def write_private(path: Path, data: bytes) -> None:
    """Write private key material: mode 0600 from the first byte."""
    write_atomic(path, data, mode=PRIVATE_MODE)


@contextlib.contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Serialise writers (issue, revoke, init) of one cert directory across processes."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)

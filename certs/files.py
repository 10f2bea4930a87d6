"""Atomic, permission-correct writes so a reader never sees half a key, cert or CRL."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

PRIVATE_MODE = 0o600
PUBLIC_MODE = 0o644
DIRECTORY_MODE = 0o700
LOCK_FILE = ".lock"


def write_atomic(path: Path, data: bytes, *, mode: int = PUBLIC_MODE) -> None:
    """Write ``data`` to ``path`` via a temp file created with ``mode``, fsync, os.replace.

    The temp file is created with its final mode (never chmod-ed afterwards), so a private
    key is never readable by others, not even for a moment.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def write_private(path: Path, data: bytes) -> None:
    """Write private key material: mode 0600 from the first byte."""
    write_atomic(path, data, mode=PRIVATE_MODE)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Serialise writers (issue, revoke, init) of one cert directory across processes."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)

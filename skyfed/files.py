"""Writing a file atomically and durably (whole or absent after a crash at any instant), and
rewriting a generated page or checking that it is fresh."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

PRIVATE_MODE = 0o600
"""What skyfed writes unless a caller says otherwise: checkpoints, the exported model,
``status.json``, keys. A run's weights and state are its operator's, not every local user's."""
PUBLIC_MODE = 0o644
"""Certificates and the CRL: public by nature."""


def write_atomic(
    path: Path, data: bytes | Callable[[BinaryIO], None], *, mode: int = PRIVATE_MODE
) -> Path:
    """Write ``data`` (bytes, or a function writing to the file) to a temporary file beside
    ``path``, fsync it, rename it over ``path`` and fsync the directory: readers see the old
    file or the new one, never a part.

    The temporary file is created with its final ``mode`` (never chmod-ed afterwards), so a
    private key is never readable by others, not even for a moment.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path


def write_text_atomic(path: Path, text: str, *, mode: int = PRIVATE_MODE) -> Path:
    """:func:`write_atomic` for text (UTF-8)."""
    return write_atomic(path, text.encode(), mode=mode)


def private_opener(path: str, flags: int) -> int:
    """``open(..., opener=private_opener)``: a file made new is 0600 from its first byte."""
    return os.open(path, flags, PRIVATE_MODE)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def regenerate(path: Path, fresh: str, command: str, argv: Sequence[str]) -> int:
    """The ``main`` of a generated page (a reference, the results index): write ``fresh`` to
    ``path``; with ``--check`` in ``argv``, write nothing and exit 1 when ``path`` differs,
    saying which ``command`` makes it fresh."""
    if "--check" in argv:
        if not path.exists() or path.read_text() != fresh:
            print(f"{path} is stale: run {command}", file=sys.stderr)
            return 1
        return 0
    path.write_text(fresh)
    print(f"wrote {path}")
    return 0

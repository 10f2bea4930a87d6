"""Writing a file atomically and durably: whole or absent after a crash at any instant."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

PUBLIC_MODE = 0o644


def write_atomic(
    path: Path, data: bytes | Callable[[BinaryIO], None], *, mode: int = PUBLIC_MODE
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


def write_text_atomic(path: Path, text: str) -> Path:
    """:func:`write_atomic` for text (UTF-8)."""
    return write_atomic(path, text.encode())


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""Logging set-up for entry points only; library code just calls ``logging.getLogger``."""

from __future__ import annotations

import logging
import os
import threading
import time

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""What ``--log-level`` accepts (any case)."""


def setup_logging(level: str | None = None, *, who: str = "skyfed") -> None:
    """One line per record, prefixed with the process's role (``coordinator``, ``aws-1``)."""
    level = (level or os.environ.get("SKYFED_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {who} %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


class Throttle:
    """Says when a repeated log line may be written again: at most once per ``interval_s``
    per key, so a peer sending garbage in a loop costs one line, not one per message."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def ready(self, key: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -float("inf")) < self.interval_s:
                return False
            if len(self._last) > 4096:  # bounded: forget the oldest keys
                self._last.clear()
            self._last[key] = now
            return True

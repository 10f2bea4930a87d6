"""Logging set-up for entry points only; library code just calls ``logging.getLogger``."""

from __future__ import annotations

import logging
import os


def setup_logging(level: str | None = None, *, who: str = "skyfed") -> None:
    """One line per record, prefixed with the process's role (``coordinator``, ``aws-1``)."""
    level = (level or os.environ.get("SKYFED_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {who} %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )

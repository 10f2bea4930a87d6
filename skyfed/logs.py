"""Logging set-up for entry points only; library code just calls ``logging.getLogger``."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""What ``--log-level`` accepts (any case)."""


def setup_logging(level: str | None = None, *, who: str = "skyfed", fmt: str | None = None) -> None:
    """One line per record, prefixed with the process's role (``coordinator``, ``aws-1``);
    ``fmt="json"``: one JSON object per line for log shippers (docs/operations.md)."""
    level = (level or os.environ.get("SKYFED_LOG_LEVEL") or "INFO").upper()
    fmt = fmt or os.environ.get("SKYFED_LOG_FORMAT") or "text"
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} must be one of {FORMATS}")
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter(who))
    else:
        handler.setFormatter(
            logging.Formatter(
                f"%(asctime)s {who} %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
            )
        )
    logging.basicConfig(level=level, handlers=[handler], force=True)


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "who", "logger", "message"}`` and, for an exception, ``"error"``:
    always one line, so a shipper never splits a record."""

    def __init__(self, who: str) -> None:
        super().__init__()
        self.who = who

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "who": self.who,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line)


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


class Phases:
    """DEBUG lines marking where a round's time goes: ``[<who>.Phase] round=R <name>
    at=<unix s>`` (and any figures), wall-clock so the lines of every process of one host
    line up (``bench/scale.py --phases`` reads them; docs/wan.md). Free when DEBUG is off."""

    def __init__(self, who: str, log: logging.Logger) -> None:
        self.who = who
        self.log = log

    def __call__(self, round_: int, name: str, **figures: float | str) -> None:
        if not self.log.isEnabledFor(logging.DEBUG):
            return
        extra = "".join(
            f" {k}={v:.4f}" if isinstance(v, float) else f" {k}={v}" for k, v in figures.items()
        )
        self.log.debug(
            "[%s.Phase] round=%d %s at=%.4f%s", self.who, round_, name, time.time(), extra
        )

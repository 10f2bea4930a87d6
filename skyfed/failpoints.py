"""Named points where a test can have this process killed, to prove a crash there loses
nothing (``tests/e2e/test_coordinator_kill_phases.py``), or corrupt what it holds, to
prove the check after it catches that (``tests/e2e/test_digest_mismatch.py``).

``SKYFED_FAILPOINT=<name>@<round>`` in the environment makes :func:`reached` SIGKILL the
process the first time the point is reached in that round: a real, uncatchable kill at
an exact phase, where a timed kill from outside could only hope to land there.
``<name>@<round>:stop`` SIGSTOPs it there instead: a process frozen mid-phase, as a long
pause of its VM freezes it, which wakes on SIGCONT believing nothing happened (a
partitioned old leader, ``tests/failover/test_fencing.py``).
``SKYFED_FAILPOINT_FILE=<path>`` reads the same text from a file instead, re-read when
it changes, so a running process can be armed (the chaos bench arms whichever replica
leads, ``bench/failover.py``). Unset, a point costs two dictionary lookups.
"""

from __future__ import annotations

import logging
import os
import signal
import time

log = logging.getLogger(__name__)

ENV = "SKYFED_FAILPOINT"
ENV_FILE = "SKYFED_FAILPOINT_FILE"
POINTS = ("upload", "mean", "downlink", "checkpoint", "broadcast")
"""The phases of a round a coordinator can be killed in, in round order."""
FAILOVER_PHASES = ("upload", "mean", "release", "broadcast", "idle")
"""The phases a leading replica is killed in by the failover tests and the chaos bench:
during the uploads, during the mean, after the mean and before any agent has the round's
end (``release``: the standbys hold it), during the round's ends going out, and idle (a
round just opened, nothing staged)."""

_file_cache: tuple[float, str | None] = (0.0, None)
_fired: set[str] = set()


def _wanted() -> str | None:
    path = os.environ.get(ENV_FILE)
    if path is None:
        return os.environ.get(ENV)
    global _file_cache
    try:
        mtime = os.stat(path).st_mtime
        if mtime != _file_cache[0]:
            with open(path) as f:
                _file_cache = (mtime, f.read().strip() or None)
    except OSError:
        return None
    return _file_cache[1]


def reached(name: str, round_: int, settle_s: float = 0.0) -> None:
    """SIGKILL this process if the environment names this point and round, ``settle_s``
    after reaching it (time for what was queued to leave: a broadcast half delivered)."""
    wanted = _wanted()
    if wanted is None or wanted.split(":")[0] != f"{name}@{round_}" or wanted in _fired:
        return
    if wanted.endswith(":stop"):
        _fired.add(wanted)  # woken, it goes on: the point is passed
        log.warning("[Failpoint] %s@%d reached: stopping the process", name, round_)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    log.warning("[Failpoint] %s@%d reached: killing the process", name, round_)
    time.sleep(settle_s)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


def corrupts(name: str, round_: int) -> bool:
    """True if the environment names this corruption and round: the caller then corrupts
    what it holds there, once (the point's round passes)."""
    wanted = _wanted()
    if wanted is None or wanted != f"{name}@{round_}":
        return False
    log.warning("[Failpoint] %s@%d reached: corrupting", name, round_)
    return True

"""Named points where a test can have this process killed, to prove a crash there loses
nothing (``tests/e2e/test_coordinator_kill_phases.py``), or corrupt what it holds, to
prove the check after it catches that (``tests/e2e/test_digest_mismatch.py``).

``SKYFED_FAILPOINT=<name>@<round>`` in the environment makes :func:`reached` SIGKILL the
process the first time the point is reached in that round: a real, uncatchable kill at
an exact phase, where a timed kill from outside could only hope to land there. Unset, a
point costs one dictionary lookup.
"""

from __future__ import annotations

import logging
import os
import signal
import time

log = logging.getLogger(__name__)

ENV = "SKYFED_FAILPOINT"
POINTS = ("upload", "mean", "downlink", "checkpoint", "broadcast")
"""The phases of a round a coordinator can be killed in, in round order."""


def reached(name: str, round_: int, settle_s: float = 0.0) -> None:
    """SIGKILL this process if the environment names this point and round, ``settle_s``
    after reaching it (time for what was queued to leave: a broadcast half delivered)."""
    wanted = os.environ.get(ENV)
    if wanted is not None and wanted == f"{name}@{round_}":
        log.warning("[Failpoint] %s@%d reached: killing the process", name, round_)
        time.sleep(settle_s)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


def corrupts(name: str, round_: int) -> bool:
    """True if the environment names this corruption and round: the caller then corrupts
    what it holds there, once (the point's round passes)."""
    wanted = os.environ.get(ENV)
    if wanted is None or wanted != f"{name}@{round_}":
        return False
    log.warning("[Failpoint] %s@%d reached: corrupting", name, round_)
    return True

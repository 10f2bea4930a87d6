"""Why a site went down, said once: each rank's one-line reason through the site's store,
the first one announced, and the last one kept for the next start (docs/sites.md).

A rank that fails on its own (an exception in its code, a signal) is the *origin*; the
others then fail on a collective with a lost peer, which says nothing about why. The
origin writes its reason under its rank; whoever first announces the site's end (the spawn
supervisor, or rank 0) takes the best reason known and is the only one to log it, with
``compare_set`` on one key. Rank 0 sends it to the coordinator before it closes its session
(``Leave``) and keeps it in the state directory, whence the next hello carries it.
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from pathlib import Path

import torch.distributed as dist

from skyfed import wire
from skyfed.files import write_atomic

log = logging.getLogger(__name__)

DOWN_KEY = "skyfed/site/down"
ANNOUNCED_KEY = "skyfed/site/announced"
ANNOUNCE_WAIT_S = 2.0
"""How long a second announcer waits for the first one's reason to reach the store."""
ERROR_KEY = "skyfed/site/error/{rank}"
MAX_REASON = 480
"""Characters of a reason (the wire allows ``skyfed.wire.MAX_ERROR``)."""
LAST_ERROR_FILE = "last-error.txt"
PRIVATE = 0o600
EXIT_SITE_DOWN = 5
"""What a rank exits with when its site went down because of another rank (or the
launcher stopped it): retrying the site can help (docs/deployment.md)."""
PEER_LOST = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "socket closed",
    "connection refused",
)


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, printable and bounded."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return printable(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def printable(text: str) -> str:
    """``text`` as one bounded line of printable characters (what the wire accepts)."""
    clean = wire.printable(text)
    return clean if len(clean) <= MAX_REASON else clean[: MAX_REASON - 3] + "..."


def lost_peer(exc: BaseException) -> bool:
    """A collective that failed because another rank is gone: a consequence, not a cause."""
    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and any(p in str(exc).lower() for p in PEER_LOST)


def where(rank: int, dp: int = 1, tp: int = 1) -> str:
    """``rank 3 (dp 1, tp 1) on host-b``: which rank, where it sits in the mesh, which host."""
    place = f" (dp {rank // tp}, tp {rank % tp})" if dp * tp > 1 else ""
    return f"rank {rank}{place} on {socket.gethostname().split('.')[0]}"


def exit_reason(code: int) -> str:
    """A rank process's end as a person reads it: ``killed by SIGKILL``, ``exited 3``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited {code}"


def report(store: dist.Store | None, rank: int, reason: str) -> None:
    """Rank ``rank``'s own reason, for whoever announces the site's end."""
    if store is None:
        return
    try:
        store.set(ERROR_KEY.format(rank=rank), reason)
    except Exception:  # the store is gone with its host: nobody is left to read it
        log.debug("could not leave rank %d's reason in the store", rank, exc_info=True)


def reported(store: dist.Store | None, world: int) -> str | None:
    """The reason a rank wrote for itself, the lowest such rank's; None: none wrote one."""
    if store is None:
        return None
    keys = [ERROR_KEY.format(rank=r) for r in range(world)]
    try:
        present = [k for k in keys if store.check([k])]
        return store.get(present[0]).decode(errors="replace") if present else None
    except Exception:
        return None


def announce(store: dist.Store | None, reason: str) -> str:
    """Make ``reason`` the site's, unless one was announced first; returns the site's
    reason and logs it if it is ours (so it is said once, whoever says it: the first to
    count on the store's counter speaks)."""
    if store is not None:
        try:
            first = store.add(ANNOUNCED_KEY, 1) == 1
        except Exception:  # no store left: say it here
            first = True
        if not first:
            return announced(store, ANNOUNCE_WAIT_S) or reason
        try:
            store.set(DOWN_KEY, reason)
        except Exception:
            log.debug("could not leave the site's reason in the store", exc_info=True)
    log.error("[Agent.Site] down: %s", reason)
    return reason


def announced(store: dist.Store | None, wait_s: float = 0.0) -> str | None:
    """The site's reason, once someone announced it (waiting up to ``wait_s``), or None."""
    if store is None:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if store.check([DOWN_KEY]):
                return store.get(DOWN_KEY).decode(errors="replace")
        except Exception:
            return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def keep(state_dir: Path | None, reason: str) -> None:
    """Keep ``reason`` in the state directory for the next start's hello."""
    if state_dir is None:
        return
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(state_dir / LAST_ERROR_FILE, printable(reason).encode(), mode=PRIVATE)
    except OSError as exc:
        log.warning("[Agent.State] could not keep the last error in %s: %s", state_dir, exc)


def kept(state_dir: Path | None) -> str:
    """The reason the last run kept ("" if none), printable and bounded."""
    if state_dir is None:
        return ""
    try:
        return printable((state_dir / LAST_ERROR_FILE).read_text(errors="replace").strip())
    except FileNotFoundError:
        return ""


def told(state_dir: Path | None) -> None:
    """The coordinator has the kept reason: forget it."""
    if state_dir is not None:
        (state_dir / LAST_ERROR_FILE).unlink(missing_ok=True)

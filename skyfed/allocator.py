"""The C allocator's settings for a process that moves large tensors through many threads.

glibc serves an allocation above its mmap threshold with its own mapping, returned to the
system when freed, but it raises that threshold (up to 32 MB) each time such a block is
freed, and per-thread arenas then keep the memory of freed payload-sized buffers for good.
Fixing the threshold keeps every large buffer (a tensor, a payload) a mapping of its own,
so peak RSS follows what is live (docs/scale.md, Memory). It sits at 2 MiB, above a
1 MiB chunk: a mapping costs a page fault per 4 KiB on first touch, and every chunk passes
through several short-lived copies (its slice, its message, its serialized bytes), which
at 128 KiB cost 5x what they cost from the arena's reused memory (1.2 against 0.24 CPU-ms
per MiB for those three on this host, docs/scale.md). The arenas then keep what a
broadcast's chunks used once they are sent: :func:`trim` gives it back before the next
round's uploads arrive. No effect off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 2 << 20


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def trim() -> None:
    """Return the arenas' free memory to the system (``malloc_trim``): the chunk buffers a
    finished transfer left in them would otherwise stay resident under the next one."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def fix_mmap_threshold() -> bool:
    """Pin glibc's mmap threshold (and so its trim threshold); False where there is no
    glibc ``mallopt``."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    ok = bool(mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD_BYTES)) and ok
    if not ok:
        log.warning("[Allocator] mallopt refused the mmap threshold")
    return ok

"""Staged uplinks beyond a memory budget: written to an unlinked file, mapped back at the close.

Staging keeps withdrawal exact (docs/scale.md, The aggregate), but held in memory the
staged uplinks grow with the number of agents: half the model per FP16 agent, four times
the model with eight. Past the budget (``stage_memory`` times the model's float32 bytes) a
checked payload is written to its contribution's file and held as a read-only map of it;
the process keeps none of its pages, the page cache does, and under memory pressure the
kernel writes them back and lets them go instead of the process growing.

Why a map and not reads into a buffer: the close decodes a payload piece by piece
(``Codec.decode_add_pieces``) with every codec's own layout; a map lets it read the bytes
where they lie, and :meth:`SpillFile.forget` drops the pages already mapped after each piece
(``MADV_DONTNEED`` on a file mapping: a page touched again is read back from the page
cache, so dropping one early costs a fault, never a value). The process then holds about
a piece of each payload at a time, not the payloads.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import threading
from pathlib import Path

SPILL_MIN_BYTES = 16 * 1024
"""Payloads smaller than this stay in memory whatever the budget: a model's biases and
norms are many and small, and each spilled payload takes whole pages of its file."""

ALIGN = mmap.ALLOCATIONGRANULARITY
"""Each payload starts at a multiple of this in its file, so pages are never shared."""


class SpillFile:
    """One contribution's spilled payloads: an unlinked, sparse file of ``capacity`` bytes,
    mapped read-only once (one map and one descriptor a contribution, however many
    payloads), written at increasing offsets.

    The file has no name, so nothing is left behind on a crash; its disk space goes with the
    last view of its map (a withdrawal or the round's end drops them).
    """

    def __init__(self, directory: Path | None, capacity: int) -> None:
        self.capacity = max(ALIGN, _aligned(capacity))
        with tempfile.TemporaryFile(dir=directory) as file:
            os.ftruncate(file.fileno(), self.capacity)  # sparse: no disk until written
            self._fd = os.dup(file.fileno())
        self._map = mmap.mmap(self._fd, self.capacity, access=mmap.ACCESS_READ)
        self._end = 0
        self._lock = threading.Lock()

    def write(self, data: memoryview | bytes) -> memoryview | None:
        """``data`` on disk and a read-only view of it there; None where it does not fit
        (the caller keeps it in memory)."""
        nbytes = len(data)
        with self._lock:
            offset = self._end
            if offset + nbytes > self.capacity:
                return None
            self._end = _aligned(offset + nbytes)
        view, done = memoryview(data).cast("B"), 0
        while done < nbytes:
            done += os.pwrite(self._fd, view[done:], offset + done)
        return memoryview(self._map)[offset : offset + nbytes]

    def forget(self) -> None:
        """Drop every page of the file the process has mapped; they stay in the page cache
        and a page read again is mapped again from there."""
        self._map.madvise(mmap.MADV_DONTNEED)

    def __del__(self) -> None:
        # The map keeps its own descriptor (Python dups it); closing ours leaves the file
        # alive exactly as long as a view of the map is.
        fd = getattr(self, "_fd", None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a whole :data:`ALIGN`."""
    return -(-nbytes // ALIGN) * ALIGN

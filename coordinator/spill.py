"""Staged uplinks beyond a memory budget: written to an unlinked file, mapped back at the close.

Staging keeps withdrawal exact (docs/scale.md, The aggregate), but held in memory the
staged uplinks grow with the number of agents: half the model per FP16 agent, four times
the model with eight. Past the budget (``stage_memory`` times the model's float32 bytes) a
payload is put together in its contribution's file as its chunks arrive
(:class:`SpillRegion`, written with ``pwrite``: the process maps none of it while it
arrives), or, arriving whole, written there once checked; it is held as a read-only map
of the file. The process keeps none of its pages, the page cache does, and under memory
pressure the kernel writes them back and lets them go instead of the process growing.

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

    def region(self, nbytes: int) -> SpillRegion | None:
        """``nbytes`` of the file to write a payload into; None where they do not fit (the
        caller keeps the payload in memory). Their blocks are allocated now, so a full
        disk is an ``OSError`` here, before any of the payload is written, not half-way."""
        with self._lock:
            offset = self._end
            if offset + nbytes > self.capacity:
                return None
            self._end = _aligned(offset + nbytes)
        if nbytes:
            os.posix_fallocate(self._fd, offset, nbytes)
        return SpillRegion(self, offset, nbytes)

    def write(self, data: memoryview | bytes) -> memoryview | None:
        """``data`` on disk and a read-only view of it there; None where it does not fit
        (the caller keeps it in memory)."""
        nbytes = len(data)
        region = self.region(nbytes)
        if region is None:
            return None
        region[0:nbytes] = data
        return region[0:nbytes]

    def holds(self, data: object) -> bool:
        """Whether ``data`` is a view of this file (a payload staged in it)."""
        return isinstance(data, memoryview) and data.obj is self._map

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


class SpillRegion:
    """One payload's place in its contribution's file, written as its chunks arrive (the
    ``Assembler``'s buffer, ``proto/chunks.py``) and read back as a view of the file's map.

    Written with ``pwrite``, not through the map: the pages then go to the page cache only,
    where a writable map's pages would count in the process while the payload arrives, as
    a pool buffer's do (taken back in ``7621783``: eight FP16 uplinks arriving at once still
    peaked as eight).
    """

    def __init__(self, file: SpillFile, offset: int, nbytes: int) -> None:
        self._file = file
        self._offset = offset
        self._nbytes = nbytes

    def __setitem__(self, index: slice, data: memoryview | bytes) -> None:
        start, stop = self._bounds(index)
        view, done = memoryview(data).cast("B"), 0
        if len(view) != stop - start:
            raise ValueError(f"{len(view)} bytes written into [{start}, {stop})")
        while done < len(view):
            done += os.pwrite(self._file._fd, view[done:], self._offset + start + done)

    def __getitem__(self, index: slice) -> memoryview:
        start, stop = self._bounds(index)
        return memoryview(self._file._map)[self._offset + start : self._offset + stop]

    def _bounds(self, index: slice) -> tuple[int, int]:
        start, stop, step = index.indices(self._nbytes)
        if step != 1:
            raise ValueError("a spill region takes contiguous slices only")
        return start, stop


def _aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a whole :data:`ALIGN`."""
    return -(-nbytes // ALIGN) * ALIGN

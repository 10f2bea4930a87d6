"""Payload memory kept mapped from round to round, each buffer reused once nothing holds it.

A round's uplinks arrive into payload-sized buffers that live until the close; new
memory for them each round costs the kernel zeroing every page on first touch, and on a
VM whose balloon takes freed pages back (free page reporting) each page is also faulted
in from the host: on the development host 1.7 CPU-ms per MiB for memory freed a few
seconds earlier against 0.27 for memory freed just before, ~1 CPU-s a round for the
coordinator's 600 MB of FP16 uplinks at 100M parameters (docs/scale.md). Kept, the same
pages serve the next round's uplinks. What is kept is what the round held at its peak
anyway (the staged uplinks), and a buffer no round took is let go at the next sweep, so
a smaller codec's rounds do not keep a larger one's memory.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

import numpy as np


@dataclass(eq=False, slots=True)
class _Slot:
    array: np.ndarray
    """The memory; every view made from it holds a reference to it."""
    taken: bool = True
    """Taken since the last sweep."""


class PayloadPool:
    """numpy buffers lent for payloads, reused by what their reference counts say.

    A buffer is lent again only when nothing made from it (a payload's ``memoryview``, a
    slice of one, a tensor or array over it) is alive anywhere: a payload is never
    overwritten while anyone holds it, whoever holds it, and a holder need not give
    anything back. Thread-safe.
    """

    def __init__(self) -> None:
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> memoryview:
        """``nbytes`` of writable memory, not zeroed: the smallest free buffer that holds
        them and is under twice their size (so a small payload does not pin a large
        buffer), else a new one."""
        with self._lock:
            best: _Slot | None = None
            for slot in self._slots:
                size = slot.array.size
                fits = nbytes <= size < 2 * max(nbytes, 1)
                if fits and (best is None or size < best.array.size) and self._free(slot):
                    best = slot
            if best is None:
                best = _Slot(np.empty(nbytes, dtype=np.uint8))
                self._slots.append(best)
            best.taken = True
            return memoryview(best.array)[:nbytes]

    def sweep(self) -> int:
        """Let go of the free buffers nothing took since the last sweep (call it once a
        round); the bytes let go."""
        with self._lock:
            kept, dropped = [], 0
            for slot in self._slots:
                if not slot.taken and self._free(slot):
                    dropped += slot.array.size
                    continue
                slot.taken = False
                kept.append(slot)
            self._slots = kept
            return dropped

    def let_go(self) -> int:
        """Let go of every free buffer now (before something model-sized is allocated
        beside them: an evaluation's copy of the weights); the bytes let go."""
        with self._lock:
            free = [slot for slot in self._slots if self._free(slot)]
            self._slots = [slot for slot in self._slots if slot not in free]
            return sum(slot.array.size for slot in free)

    @property
    def nbytes(self) -> int:
        """The memory of every buffer the pool knows, lent or free."""
        with self._lock:
            return sum(slot.array.size for slot in self._slots)

    @staticmethod
    def _free(slot: _Slot) -> bool:
        # The slot's own reference and getrefcount's argument: 2 when nothing else.
        return sys.getrefcount(slot.array) <= 2

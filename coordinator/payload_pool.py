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
from collections.abc import Callable
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
        self._slots: dict[int, list[_Slot]] = {}
        """By size: a round asks for the same sizes as the last, so a take looks at the
        buffers of its own size first, not at every buffer (a model of many tensors)."""
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> memoryview:
        """``nbytes`` of writable memory, not zeroed: a free buffer of that size, else the
        smallest free one that holds them and is under twice their size (so a small
        payload does not pin a large buffer), else a new one."""
        with self._lock:
            best = next((s for s in self._slots.get(nbytes, ()) if self._free(s)), None)
            if best is None:
                sizes = sorted(n for n in self._slots if nbytes < n < 2 * max(nbytes, 1))
                best = next((s for n in sizes for s in self._slots[n] if self._free(s)), None)
            if best is None:
                best = _Slot(np.empty(nbytes, dtype=np.uint8))
                self._slots.setdefault(nbytes, []).append(best)
            best.taken = True
            return memoryview(best.array)[:nbytes]

    def sweep(self) -> int:
        """Let go of the free buffers nothing took since the last sweep (call it once a
        round); the bytes let go."""
        with self._lock:
            dropped = self._keep(lambda slot: slot.taken or not self._free(slot))
            for slots in self._slots.values():
                for slot in slots:
                    slot.taken = False
            return dropped

    def let_go(self) -> int:
        """Let go of every free buffer now (before something model-sized is allocated
        beside them: an evaluation's copy of the weights); the bytes let go."""
        with self._lock:
            return self._keep(lambda slot: not self._free(slot))

    def _keep(self, keep: Callable[[_Slot], bool]) -> int:
        """Keep the buffers ``keep`` says; the bytes of the others (the caller holds the
        lock)."""
        dropped = 0
        for size in list(self._slots):
            kept = [slot for slot in self._slots[size] if keep(slot)]
            dropped += size * (len(self._slots[size]) - len(kept))
            if kept:
                self._slots[size] = kept
            else:
                del self._slots[size]
        return dropped

    @property
    def nbytes(self) -> int:
        """The memory of every buffer the pool knows, lent or free."""
        with self._lock:
            return sum(size * len(slots) for size, slots in self._slots.items())

    @staticmethod
    def _free(slot: _Slot) -> bool:
        # The slot's own reference and getrefcount's argument: 2 when nothing else.
        return sys.getrefcount(slot.array) <= 2

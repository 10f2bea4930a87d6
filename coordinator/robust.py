"""Bounding one agent's pull on the model: its weight in the mean, its update's norm.

Without these one contribution with ``samples = 2^24`` and a huge update moved every
weight by that update. The weight (``samples``) is capped by ``max_samples``; an update
whose L2 norm exceeds ``clip_norm_ratio`` times the median of the recent accepted norms
is scaled down to that bound (norm clipping) before it counts. Clipping works on the
streaming sum, so it costs no memory beyond what withdrawal already keeps (the encoded
payloads of the one contribution in flight): a coordinate-wise median or trimmed mean
would keep every contribution dense until the round closes, agents x model float32
(docs/security.md, "One agent cannot steer the model").
"""

from __future__ import annotations

import logging
import statistics
from collections import deque

log = logging.getLogger(__name__)

WARMUP = 3
"""Accepted norms seen before the bound applies (a federation's first contributions)."""
WINDOW = 32
"""Recent accepted norms the median is taken over (a few rounds of a few agents)."""


class NormBound:
    """Clips update norms to ``ratio`` x the median of the last ``WINDOW`` accepted ones."""

    def __init__(self, ratio: float, window: int = WINDOW, warmup: int = WARMUP) -> None:
        self.ratio = ratio
        self.warmup = warmup
        self._norms: deque[float] = deque(maxlen=window)

    def limit(self) -> float | None:
        """The largest norm accepted unscaled now; None while off or warming up."""
        if self.ratio <= 0 or len(self._norms) < self.warmup:
            return None
        return self.ratio * statistics.median(self._norms)

    def factor(self, norm: float) -> float:
        """What an update of ``norm`` is multiplied by before it counts (1.0: as sent)."""
        limit = self.limit()
        if limit is None or norm <= limit or norm == 0:
            return 1.0
        return limit / norm

    def record(self, norm: float) -> None:
        """An accepted update's norm after clipping: a clipped outlier cannot raise the
        median by more than the bound itself."""
        self._norms.append(norm)

    def norms(self) -> list[float]:
        return list(self._norms)

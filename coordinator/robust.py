"""Bounding one agent's pull on the model: its weight in the mean, its update's norm.

Without these one contribution with ``samples = 2^24`` and a huge update moved every
weight by that update. The weight (``samples``) is capped by ``max_samples``
(``coordinator/round.py``); an update whose L2 norm exceeds ``clip_norm_ratio`` times a
reference norm is scaled down to that bound (norm clipping) before it counts. Clipping
scales a contribution's term in the sum, so it costs no memory: a coordinate-wise median
or trimmed mean would keep every contribution dense until the round closes, agents x
model float32 (docs/security.md, "One agent cannot steer the model").

The bound is set once per round, at its close, from every norm the round holds and the
recent rounds' accepted (clipped) norms: the same factors whatever order the uploads
arrived in, so a round replayed in the simulation gives the federation's bits. Rules:

- from the first round on: a fresh (or restarted) coordinator has a reference from the
  round's own norms, and the window of recent norms is in the checkpoint;
- with three or more reference norms, the lower median: one agent among three or more
  cannot move it past an honest norm, and with an even count it is never the mean of an
  honest norm and an attacker's (the mean let one attacker of two set its own bound);
- with fewer than three, the smallest: with two sites, an attacker can lower the bound
  (slowing the other site's update), never raise it.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping

log = logging.getLogger(__name__)

WINDOW = 32
"""Recent accepted norms the reference is taken over, with the round's own (a few rounds
of a few agents)."""
MEDIAN_FROM = 3
"""Reference norms from which the lower median is taken; below it, the smallest."""


class NormBound:
    """Clips each round's update norms to ``ratio`` x a reference no single agent can raise."""

    def __init__(self, ratio: float, window: int = WINDOW) -> None:
        self.ratio = ratio
        self._norms: deque[float] = deque(maxlen=window)

    def limit(self, norms: Iterable[float]) -> float | None:
        """The largest norm accepted unscaled in a round whose updates have ``norms``;
        None when clipping is off or nothing is known."""
        reference = [*self._norms, *(n for n in norms if math.isfinite(n))]
        if self.ratio <= 0 or not reference:
            return None
        if len(reference) >= MEDIAN_FROM:
            return self.ratio * statistics.median_low(reference)
        return self.ratio * min(reference)

    def clip(self, norms: Mapping[str, float]) -> dict[str, float]:
        """Each update's factor (1.0: as sent) for a round whose updates, by agent, have
        ``norms``; the clipped norms join the window (a clipped outlier cannot raise the
        reference by more than the bound itself)."""
        limit = self.limit(norms.values())
        factors = {}
        for key, norm in norms.items():
            factor = 1.0 if limit is None or norm <= limit or norm == 0 else limit / norm
            if factor < 1.0:
                log.warning(
                    "[Coordinator.Clip] agent=%s norm=%.4g clipped to %.4g",
                    key,
                    norm,
                    norm * factor,
                )
            factors[key] = factor
        for key in sorted(norms):  # the window's order does not depend on arrival
            self._norms.append(norms[key] * factors[key])
        return factors

    def state(self) -> list[float]:
        """The window, for a checkpoint: a restart clips as the run before it would have."""
        return list(self._norms)

    def load(self, norms: Iterable[float]) -> None:
        self._norms.clear()
        self._norms.extend(float(n) for n in norms)

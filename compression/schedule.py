"""Density warm-up for Top-k: start dense, shrink exponentially to the target density."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class DensityWarmup:
    """Deep Gradient Compression's warm-up (Lin et al. 2018): over the first ``steps``
    rounds the kept fraction falls geometrically from ``start`` to ``final``,
    ``d(t) = start * (final / start) ** (t / steps)``, then stays at ``final``.

    Early gradients change fast and a residual built on them goes stale; sending more of
    them at first keeps the error feedback's delay short. DGC's momentum correction is not
    needed here: skyfed exchanges pseudo-gradients (``w_start - w_end`` over an agent's
    local AdamW steps), so the momentum already acted inside what is sent, and the outer
    step ``w -= outer_lr * mean`` has no momentum of its own to correct.
    """

    final: float
    """The density after warm-up (e.g. 0.001)."""
    start: float = 0.25
    """The density at step 0."""
    steps: int = 100
    """Rounds over which the density shrinks; 0 disables the warm-up."""

    def __post_init__(self) -> None:
        if not 0.0 < self.final <= 1.0:
            raise ValueError(f"DensityWarmup.final must be in (0, 1], got {self.final!r}")
        if not self.final <= self.start <= 1.0:
            raise ValueError(f"DensityWarmup.start must be in [final, 1], got {self.start!r}")
        if self.steps < 0:
            raise ValueError(f"DensityWarmup.steps must be >= 0, got {self.steps!r}")

    def density(self, step: int) -> float:
        """The density to use at round ``step`` (0-based)."""
        if step >= self.steps:
            return self.final
        return self.start * (self.final / self.start) ** (step / self.steps)

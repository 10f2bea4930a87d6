"""Error-feedback residuals: what a lossy codec did not send yet, kept per tensor shard."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from skyfed.compression.base import Codec
from skyfed.compression.frame import PayloadBuffer
from skyfed.compression.norms import squared_norm


def released(
    codec: Codec, g: torch.Tensor, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(p, held)``: what ``codec`` encodes this round, ``g`` plus (some of) the residual,
    and the part of the residual that waits (None: none).

    The textbook rule adds the whole residual. A codec that sends all of its input
    (:attr:`Codec.bounded_release`: FP16/BF16/FP32) takes at most ``|g|`` of it per round
    (L2, per tensor): after a Top-k phase the residual holds many rounds of delayed
    updates, and a link that switched to FP16 sent them in one step and spiked the loss
    (2.51 -> 2.85 held-out, ``bench/adaptive.py``, gradient exchange). Held work is delayed,
    not lost. A residual no larger than ``g`` (FP16's own rounding error) goes whole; a
    tensor whose update is exactly zero holds its residual until it moves again.
    """
    if residual is None:
        return g, None
    if not codec.bounded_release:
        return g + residual, None
    share = release_share(g, residual)
    if share is None:
        return g + residual, None
    return g + residual * share, residual * (1.0 - share)


def release_share(g: torch.Tensor, residual: torch.Tensor) -> float | None:
    """``|g| / |e|`` (L2) where the residual is the larger, else None (it goes whole):
    the share of the residual a bounded-release codec sends with ``g``."""
    g_sq, e_sq = squared_norm(g), squared_norm(residual)
    if e_sq <= g_sq:
        return None
    return math.sqrt(g_sq / e_sq)


@dataclass
class ErrorFeedback:
    """Residuals keyed by tensor (or shard) name, owned by one end of one link.

    The invariant over any run of rounds: sum of what was sent (decoded) plus the current
    residual equals the sum of what was fed in, to float tolerance. A residual is a plain
    float32 tensor, so it carries over when the link switches codec.
    """

    residuals: dict[str, torch.Tensor] = field(default_factory=dict)
    memory: Callable[[int], memoryview] | None = None
    """Where payload memory comes from (``PayloadBuffer``'s ``memory``): the coordinator's
    pool, which keeps it mapped between rounds; None: new numpy memory per encode."""

    def encode(self, key: str, codec: Codec, g: torch.Tensor) -> tuple[bytes, torch.Tensor]:
        """Encode ``g`` plus the key's residual; return the payload and what it sends, ``D(c)``.

        If the payload is never counted (a late or refused contribution), :meth:`credit` the
        returned ``sent`` back, so the work is delayed, not lost.
        """
        return self.encode_all(codec, {key: g})[key]

    def encode_all(
        self, codec: Codec, tensors: dict[str, torch.Tensor]
    ) -> dict[str, tuple[bytes, torch.Tensor]]:
        """:meth:`encode` for a set of tensors that travel together, so the codec can plan
        across them (Top-k: one threshold for the set, :meth:`Codec.plan`)."""
        pending, held = {}, {}
        for key, g in tensors.items():
            pending[key], held[key] = released(codec, g, self.residuals.get(key))
        out = {}
        for key, each in codec.plan(pending).items():
            p = pending[key]
            payload, residual = each.encode_with_feedback(p, None)
            kept = held[key]
            self.residuals[key] = residual if kept is None else residual + kept
            out[key] = (payload, p - residual)
        return out

    def buffer(self, key: str) -> PayloadBuffer:
        """The key's payload memory for its next encode: new memory each time (from
        ``memory`` where it is set), so a payload's memory lives exactly as long as the
        payload (an unacknowledged upload, a broadcast's encode) and nothing payload-sized
        is held between rounds: kept per key, it held half the model at each end with
        FP16, through an agent's local steps' peak. New memory costs its first touch:
        8-13 % of an FP16 encode right after a free, several times that once the freed
        pages sat a few seconds (docs/scale.md), hence the coordinator's pool."""
        return PayloadBuffer(self.memory)

    def credit(self, key: str, x: torch.Tensor) -> None:
        """Add ``x`` to the key's residual: unsent work that goes out with a later payload."""
        previous = self.residuals.get(key)
        self.residuals[key] = x if previous is None else previous + x

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of the residuals (a checkpoint must not change as training goes on)."""
        return {k: v.clone() for k, v in self.residuals.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Replace every residual by a copy of ``state``'s."""
        self.residuals = {k: v.clone() for k, v in state.items()}

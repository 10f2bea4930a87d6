"""Error-feedback residuals: what a lossy codec did not send yet, kept per tensor shard."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from skyfed.compression.base import Codec


@dataclass
class ErrorFeedback:
    """Residuals keyed by tensor (or shard) name, owned by one end of one link.

    The invariant over any run of rounds: sum of what was sent (decoded) plus the current
    residual equals the sum of what was fed in, to float tolerance. A residual is a plain
    float32 tensor, so it carries over when the link switches codec.
    """

    residuals: dict[str, torch.Tensor] = field(default_factory=dict)

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
        pending = {}
        for key, g in tensors.items():
            previous = self.residuals.get(key)
            pending[key] = g if previous is None else g + previous
        out = {}
        for key, each in codec.plan(pending).items():
            p = pending[key]
            payload, residual = each.encode_with_feedback(p, None)
            self.residuals[key] = residual
            out[key] = (payload, p - residual)
        return out

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

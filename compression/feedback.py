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
        """Encode ``g`` plus the key's residual; return the payload and the pre-encode value.

        The returned ``p = g + e`` lets the caller :meth:`restore` it if the payload is
        never accepted (a late or refused contribution), so the work is delayed, not lost.
        """
        previous = self.residuals.get(key)
        p = g if previous is None else g + previous
        payload, residual = codec.encode_with_feedback(p, None)
        self.residuals[key] = residual
        return payload, p

    def restore(self, key: str, p: torch.Tensor) -> None:
        """Put an unsent ``p`` back into the residual (the payload never counted)."""
        self.residuals[key] = p

    def norm(self) -> float:
        """L2 norm over all residuals, for logs and tests."""
        total = sum(float(r.double().pow(2).sum()) for r in self.residuals.values())
        return total**0.5

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of the residuals (a checkpoint must not change as training goes on)."""
        return {k: v.clone() for k, v in self.residuals.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Replace every residual by a copy of ``state``'s."""
        self.residuals = {k: v.clone() for k, v in state.items()}

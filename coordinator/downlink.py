"""The broadcast's encoder: one payload for every link, with the coordinator's own residual.

DoubleSqueeze-style: the mean update plus what earlier broadcasts held back is encoded
once, with the heaviest codec any member's link runs, so the one payload suits the worst
link; the canonical weights take exactly what agents will decode, and what the codec did
not send waits in an :class:`~skyfed.compression.feedback.ErrorFeedback`, the same class
the agents' uplinks use.

Nothing model-sized is made per round (docs/scale.md): each tensor's update is computed
into one reused buffer (the aggregate decodes the mean straight into it), error feedback
works in the residual's own memory (``ErrorFeedback.encode``), the weights take each
payload decoded straight into them, and payloads are yielded tensor by tensor, so the
first chunks can leave while later tensors are still being encoded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

from skyfed.compression import decode_add_payload, make_codec, rounding_seed
from skyfed.compression.feedback import ErrorFeedback
from skyfed.compression.policy import PolicyConfig, heaviest
from skyfed.coordinator.links import CodecRun
from skyfed.fingerprint import TensorInfo
from skyfed.wire import Payload

SENDER = "coordinator"
"""Who sends the downlink, for its rounding seed (agent names default to <cloud>-<n>)."""

Update = Callable[[int, torch.Tensor], torch.Tensor]
"""``update(i, out)``: tensor ``i``'s update written into ``out`` (float32, its shape)."""


class Downlink:
    """Encodes each round's update once; owns the downlink's residuals and codec history."""

    def __init__(self, spec: Sequence[TensorInfo], policy: PolicyConfig, seed: int) -> None:
        self.names = [t.name for t in spec]
        self.shapes = [t.shape for t in spec]
        self.policy, self.seed = policy, seed
        self.feedback = ErrorFeedback()
        self.run = CodecRun()
        """The downlink's codec and the round it started; Top-k's warm-up counts from it."""
        self._buffer = torch.empty(max((t.numel for t in spec), default=0))

    @staticmethod
    def codec_for(link_codecs: Iterable[str]) -> str:
        """The heaviest of the members' link codecs: the one broadcast suits the worst link."""
        return heaviest(link_codecs)

    def encode(
        self,
        weights: list[torch.Tensor],
        update: Update,
        codec_name: str,
        contributors: int,
        round_: int,
        local_steps: int = 0,
    ) -> Iterator[Payload]:
        """Encode each tensor's ``update`` (+ residual) once; subtract from ``weights``
        exactly what the agents will decode from the payloads. Lazy: tensor ``i`` is
        encoded and applied when its payload is asked for (a codec that plans across the
        model forms every tensor's ``p`` before the first payload). ``local_steps``: the
        fewest any member runs per round (the policy's long-phase rule; 0: not known)."""
        self.run = self.run.at(codec_name, round_)
        params = self.run.params(self.policy, round_, local_steps)
        seed = rounding_seed(self.seed, SENDER, round_)
        codec = make_codec(codec_name, seed=seed, **params).for_downlink(contributors)
        residuals = self.feedback.residuals
        if codec.capabilities.lossless and not residuals:  # nothing held, nothing to hold
            for i in range(len(self.names)):
                data = codec.encode(update(i, self._scratch(i)))
                decode_add_payload(data, weights[i], -1.0)  # w - u: the codec is lossless
                yield Payload(i, None, codec_name, data)
            return
        index = {name: i for i, name in enumerate(self.names)}
        updates = ((name, update(i, self._scratch(i))) for i, name in enumerate(self.names))
        own = dict(zip(self.names, weights, strict=True))  # w - D(c), as the agents decode it
        for name, data in self.feedback.encode(
            codec, updates, borrowed=True, applied_to=own, alpha=-1.0
        ):
            yield Payload(index[name], None, codec_name, data)  # the plan keeps the model's order
        if codec.capabilities.lossless and not any(bool(r.any()) for r in residuals.values()):
            residuals.clear()  # a lossless round that released everything owes nothing

    def _scratch(self, i: int) -> torch.Tensor:
        """The one reused float32 buffer, shaped as tensor ``i``."""
        shape = self.shapes[i]
        return self._buffer[: math.prod(shape)].view(shape)

    def residual_of(self, i: int) -> torch.Tensor | None:
        """Tensor ``i``'s residual (None: nothing held), live: final once its payload of
        the round is out."""
        return self.feedback.residuals.get(self.names[i])

    def residual_list(self) -> list[torch.Tensor] | None:
        """The residuals in model order, for a checkpoint (None: nothing held)."""
        r = self.feedback.residuals
        if not r:
            return None
        return [
            r[n] if n in r else torch.zeros(shape)
            for n, shape in zip(self.names, self.shapes, strict=True)
        ]

    def load_residual_list(self, residuals: list[torch.Tensor] | None) -> None:
        """Take a checkpoint's residuals back (None: nothing held)."""
        self.feedback.residuals = dict(zip(self.names, residuals or [], strict=False))

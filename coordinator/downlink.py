"""The broadcast's encoder: one payload for every link, with the coordinator's own residual.

DoubleSqueeze-style: the mean update plus what earlier broadcasts held back is encoded
once, with the heaviest codec any member's link runs, so the one payload suits the worst
link; the canonical weights take exactly what agents will decode, and what the codec did
not send waits in an :class:`~skyfed.compression.feedback.ErrorFeedback`, the same class
the agents' uplinks use.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from skyfed.compression import decode_payload, make_codec, rounding_seed
from skyfed.compression.feedback import ErrorFeedback
from skyfed.compression.policy import PolicyConfig, heaviest
from skyfed.coordinator.links import CodecRun
from skyfed.fingerprint import TensorInfo
from skyfed.wire import Payload

SENDER = "coordinator"
"""Who sends the downlink, for its rounding seed (agent names default to <cloud>-<n>)."""


class Downlink:
    """Encodes each round's update once; owns the downlink's residuals and codec history."""

    def __init__(self, spec: Sequence[TensorInfo], policy: PolicyConfig, seed: int) -> None:
        self.names = [t.name for t in spec]
        self.shapes = [t.shape for t in spec]
        self.policy, self.seed = policy, seed
        self.feedback = ErrorFeedback()
        self.run = CodecRun()
        """The downlink's codec and the round it started; Top-k's warm-up counts from it."""

    @staticmethod
    def codec_for(link_codecs: Iterable[str]) -> str:
        """The heaviest of the members' link codecs: the one broadcast suits the worst link."""
        return heaviest(link_codecs)

    def encode(
        self,
        weights: list[torch.Tensor],
        update: list[torch.Tensor],
        codec_name: str,
        contributors: int,
        round_: int,
    ) -> list[Payload]:
        """Encode ``update`` (+ residual) once; subtract from ``weights`` exactly what the
        agents will decode from the payloads."""
        self.run = self.run.at(codec_name, round_)
        params = self.run.params(self.policy, round_)
        seed = rounding_seed(self.seed, SENDER, round_)
        codec = make_codec(codec_name, seed=seed, **params).for_downlink(contributors)
        residuals = self.feedback.residuals
        if codec.lossless and not residuals:  # nothing held, nothing to hold
            for w, u in zip(weights, update, strict=True):
                w.sub_(u)
            return [Payload(i, None, codec_name, codec.encode(u)) for i, u in enumerate(update)]
        sent = self.feedback.encode_all(codec, dict(zip(self.names, update, strict=True)))
        payloads = []
        for i, name in enumerate(self.names):  # the plan keeps the model's order
            data, _ = sent[name]
            weights[i].sub_(decode_payload(data))
            payloads.append(Payload(i, None, codec_name, data))
        if codec.lossless and not any(bool(r.any()) for r in residuals.values()):
            residuals.clear()  # a lossless round that released everything owes nothing
        return payloads

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

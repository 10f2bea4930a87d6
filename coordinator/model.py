"""The federation's model on the coordinator: the canonical weights, and all that a round
carries into the next (the outer optimizer's momentum, the downlink's residual, the window
of recent update norms, the round counter).

The coordinator serves it over the network; the in-process simulation
(``skyfed/simulate.py``) runs the same object with no sockets, so both take every round
through the same code (``coordinator/round.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from skyfed.compression import make_codec
from skyfed.compression.policy import PolicyConfig
from skyfed.coordinator.checkpoint import Checkpoint
from skyfed.coordinator.downlink import Downlink
from skyfed.coordinator.outer import OuterOptimizer, OuterSettings
from skyfed.coordinator.robust import NormBound
from skyfed.fingerprint import TensorInfo, spec_digest, weights_digest
from skyfed.wire import raw_bytes

if TYPE_CHECKING:
    from skyfed.coordinator.round import Round


@dataclass(frozen=True, kw_only=True, slots=True)
class RoundRules:
    """How a round turns its contributions into the update every member applies."""

    max_samples: int = 65536
    """The most weight (``samples``) one contribution counts with in the mean."""
    clip_norm_ratio: float = 4.0
    """An update's norm past this times the round's reference norm is scaled down to it
    (0: no clipping; ``coordinator/robust.py``)."""
    outer: OuterSettings = field(default_factory=OuterSettings)
    """The outer step on the round's mean."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The codecs' parameters (the downlink's, round by round)."""
    seed: int = 0
    """Seeds the downlink's stochastic rounding."""
    stage_memory: float = math.inf
    """A round's staged uplinks held in memory at most, as a multiple of the model's
    float32 bytes; past it, dense payloads wait for the close on disk."""
    spill_dir: Path | None = None
    """Where uplinks past ``stage_memory`` are staged (None: the temporary directory)."""


class Model:
    """The canonical weights and the state that crosses rounds; :meth:`open` starts the
    next round (``coordinator/round.py``)."""

    def __init__(
        self,
        spec: Sequence[TensorInfo],
        weights: list[torch.Tensor],
        rules: RoundRules,
        *,
        memory: Callable[[int], memoryview] | None = None,
    ) -> None:
        """``memory``: where the downlink's payloads take their memory (the coordinator's
        pool, kept mapped from round to round; None: new memory per encode)."""
        self.spec = list(spec)
        self.spec_digest = spec_digest(self.spec)
        self.weights = weights
        self.rules = rules
        self.round = 0
        """The next round to close: every round before it is in ``weights``."""
        self.weights_digest = weights_digest(weights)
        self.outer = OuterOptimizer(rules.outer)
        self.downlink = Downlink(self.spec, rules.policy, rules.seed)
        self.downlink.feedback.memory = memory
        self.norms = NormBound(rules.clip_norm_ratio)

    @property
    def stage_memory_bytes(self) -> int | None:
        """A round's staged uplinks held in memory at most, in bytes (None: no limit)."""
        budget = self.rules.stage_memory * raw_bytes(self.spec)
        return None if math.isinf(budget) else int(budget)

    def open(self) -> Round:
        """Round :attr:`round`, ready for contributions."""
        from skyfed.coordinator.round import Round  # round.py builds on this module

        return Round(self)

    def weights_payloads(self) -> list[bytes]:
        """The weights as FP32 payloads, one per tensor: what a member that is behind
        loads (a resync), bit for bit."""
        fp32 = make_codec("fp32")
        return [fp32.encode(w) for w in self.weights]

    def checkpoint(self) -> Checkpoint:
        """What a restart (or a standby) resumes from, for the last closed round; the
        tensors are live: the caller must not hold them past the next close."""
        return Checkpoint(
            round=self.round - 1,
            spec_digest=self.spec_digest,
            weights=self.weights,
            downlink_residual=self.downlink.residual_list(),
            outer_momentum=self.outer.state(),
            norms=self.norms.state(),
        )

    def resume(self, ckpt: Checkpoint) -> None:
        """Take a checkpoint's state: the next round is the one after it."""
        if ckpt.spec_digest != self.spec_digest:
            raise ValueError(
                f"the checkpoint is for model {ckpt.spec_digest}, this federation trains "
                f"{self.spec_digest}"
            )
        self.weights, self.round = ckpt.weights, ckpt.round + 1
        self.weights_digest = weights_digest(self.weights)
        self.downlink.load_residual_list(ckpt.downlink_residual)
        self.outer.load(ckpt.outer_momentum)
        self.norms.load(ckpt.norms)

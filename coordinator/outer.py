"""The coordinator's outer optimizer: the round's mean pseudo-gradient in, the step out.

Every member applies ``w -= step`` (after the downlink's codec), so the optimizer's state
lives on the coordinator alone and agents stay bit-identical. ``sgd`` with no momentum is
federated averaging (``step = lr * g``); ``nesterov`` is DiLoCo's outer step (Douillard et
al. 2023: lr 0.7, momentum 0.9), the same arithmetic as ``torch.optim.SGD(nesterov=True)``:

    b = mu * b + g;  step = lr * (g + mu * b)        (nesterov)
    b = mu * b + g;  step = lr * b                   (sgd, mu > 0: heavy ball)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from skyfed.config.checks import ConfigError

COMPONENT = "coordinator"

OuterKind = Literal["sgd", "nesterov"]
"""The outer steps the coordinator knows (``rounds.outer_optimizer``)."""
OUTER_OPTIMIZERS: tuple[str, ...] = get_args(OuterKind)
# DiLoCo's outer Nesterov settings; plain SGD defaults to federated averaging.
DEFAULT_LR = {"sgd": 1.0, "nesterov": 0.7}
DEFAULT_MOMENTUM = {"sgd": 0.0, "nesterov": 0.9}
# With overlap every member applies a one-round-stale pseudo-gradient: at the full outer
# rate it overshoots and oscillates. Half the rate took most of that back at 4 local steps
# (docs/wan.md#overlap) and at 128 (docs/outer-optimizer.md, Defaults), so an unset
# ``outer_lr`` is halved under overlap.
OVERLAP_LR_SCALE = 0.5


NESTEROV_DEFAULTS_BELOW = 64
"""Local steps per round from which DiLoCo's unset defaults (0.7 / 0.9) are refused: at
128 they diverged (a real federation on digits: held-out loss rising every round from
0.276 to 1.257) or stalled (the simulation: 0 of 5 digits seeds and 0 of 2 chargpt seeds
reached data-parallel's loss within 2x its steps, FedAvg 2 of 5 and 2 of 2; 0.5 / 0.5
as FedAvg, 2 and 2), and at 64 they reached chargpt on 1 of 5 seeds
(docs/outer-optimizer.md, Defaults)."""


def long_phase_refusal(
    kind: str, lr: float | None, momentum: float | None, local_steps: int
) -> str | None:
    """Why an agent of ``local_steps`` per round may not join a federation whose outer
    step is ``kind`` at ``lr``, ``momentum`` as configured (None: unset); None if it may.
    Set explicitly, any rate and momentum are the operator's to try."""
    if kind != "nesterov" or lr is not None or momentum is not None:
        return None
    if local_steps < NESTEROV_DEFAULTS_BELOW:
        return None
    return (
        f"this agent runs {local_steps} local steps a round, and outer Nesterov at DiLoCo's "
        f"lr 0.7 / momentum 0.9 diverged from {NESTEROV_DEFAULTS_BELOW} on (docs/outer-"
        "optimizer.md): set the coordinator's outer_lr and outer_momentum (0.5 / 0.5 "
        'converged as FedAvg did at 128), or outer_optimizer = "sgd"'
    )


@dataclass(frozen=True, slots=True)
class OuterSettings:
    """Which outer step, at which step size and momentum (defaults resolved)."""

    kind: str = "sgd"
    lr: float = 1.0
    momentum: float = 0.0

    @classmethod
    def resolve(
        cls, kind: str, lr: float | None, momentum: float | None, *, overlap: bool = False
    ) -> OuterSettings:
        """``None`` takes the optimizer's default (the rate :data:`OVERLAP_LR_SCALE` times
        it under ``overlap``); ValueError names a bad option."""
        if kind not in OUTER_OPTIMIZERS:
            raise ConfigError(COMPONENT, "outer_optimizer", kind, f"one of {OUTER_OPTIMIZERS}")
        if lr is None:
            lr = DEFAULT_LR[kind] * (OVERLAP_LR_SCALE if overlap else 1.0)
        momentum = DEFAULT_MOMENTUM[kind] if momentum is None else momentum
        if not lr > 0:
            raise ConfigError(COMPONENT, "outer_lr", lr, "> 0")
        # Nesterov without momentum is plain SGD: ask for "sgd" instead.
        if not (0 <= momentum < 1 if kind == "sgd" else 0 < momentum < 1):
            span = "[0, 1)" if kind == "sgd" else "(0, 1)"
            raise ConfigError(COMPONENT, "outer_momentum", momentum, f"in {span}")
        return cls(kind, float(lr), float(momentum))


class OuterOptimizer:
    """Turns each round's mean pseudo-gradient into the step every member applies."""

    def __init__(self, settings: OuterSettings) -> None:
        self.settings = settings
        self.momentum: list[torch.Tensor] | None = None
        """One buffer per tensor (float32, the model's size), once a step has run; None
        while it holds nothing (and always for momentum-free SGD)."""

    @property
    def stateful(self) -> bool:
        return self.settings.momentum > 0

    def step(self, mean: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The step for this round's ``mean``; updates the momentum buffers in place."""
        if not self.stateful and self.settings.lr == 1.0:
            return list(mean)  # federated averaging: the mean itself
        return [self.step_into(i, g.clone(), len(mean)) for i, g in enumerate(mean)]

    def step_into(self, i: int, g: torch.Tensor, tensors: int) -> torch.Tensor:
        """Tensor ``i``'s step, in ``g``'s own memory (``g`` is its mean and is consumed),
        of a model of ``tensors`` tensors: the round's close takes one tensor at a time
        (docs/scale.md). Bit for bit the arithmetic of :meth:`step`'s docstring."""
        s = self.settings
        if not self.stateful:
            return g if s.lr == 1.0 else g.mul_(s.lr)
        if self.momentum is None:
            self.momentum = [None] * tensors  # type: ignore[list-item]  # filled in order
        b = self.momentum[i]
        if b is None:
            b = self.momentum[i] = g.detach().clone()
        else:
            b.mul_(s.momentum).add_(g)
        if s.kind == "nesterov":
            return g.add_(b, alpha=s.momentum).mul_(s.lr)
        return g.copy_(b).mul_(s.lr)

    def state(self) -> list[torch.Tensor] | None:
        """What a checkpoint keeps so a restart resumes the same trajectory."""
        return self.momentum

    def load(self, momentum: list[torch.Tensor] | None) -> None:
        self.momentum = momentum

"""Per-step FP32 data-parallel training: the baseline the convergence benches hold skyfed
against. It is not skyfed and runs none of its code: every step, every site's gradient is
averaged in FP32 and the task's optimizer steps on the mean, as DDP's all-reduce does.

Its bytes are counted as the benches always counted them, so figures across runs compare:
per step, every site's FP32 gradient up and the FP32 mean down to every site, each as
the FP32 payload skyfed's own FP32 codec would frame (``make_codec("fp32")``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from skyfed.compression import frame, make_codec
from skyfed.tasks.base import Task


def fp32_payload_bytes(model: nn.Module) -> tuple[int, int]:
    """One full-model FP32 payload's bytes, and of those its frames' headers."""
    fp32 = make_codec("fp32")
    payloads = [bytes(fp32.encode(p.detach())) for p in model.parameters()]
    return sum(map(len, payloads)), sum(map(frame.header_length, payloads))


class DataParallel:
    """``sites`` data-parallel replicas of ``task``'s model as one model (they are
    identical every step): site ``i`` draws shard ``i`` of ``sites`` with ``order_seed``,
    as a skyfed site of that shard and seed does."""

    def __init__(self, task: Task, seed: int, sites: int, order_seed: int | None = None) -> None:
        self.task = task
        self.model = task.build_model(seed)
        self.optimizer = task.make_optimizer(self.model.parameters())
        data_seed = seed if order_seed is None else order_seed
        self.batches: list[Iterator[Any]] = [
            task.batches(i, sites, data_seed) for i in range(sites)
        ]
        payload, framing = fp32_payload_bytes(self.model)
        self.step_bytes = 2 * sites * payload
        """Bytes one step puts on the wire: every site's gradient up, the mean down."""
        self.step_framing = 2 * sites * framing
        self.steps = 0

    @property
    def bytes(self) -> int:
        """Bytes on the wire over the steps so far."""
        return self.steps * self.step_bytes

    @property
    def framing(self) -> int:
        return self.steps * self.step_framing

    def step(self) -> None:
        """One step: each site's gradient on its next batch, their mean, the optimizer."""
        gradients = [self.gradient(batches) for batches in self.batches]
        for i, p in enumerate(self.model.parameters()):
            p.grad = sum(g[i] for g in gradients) / len(gradients)  # type: ignore[assignment]
        self.optimizer.step()
        self.steps += 1

    def gradient(self, batches: Iterator[Any]) -> list[torch.Tensor]:
        """The gradient of the loss on the next batch of ``batches``, per parameter."""
        self.model.zero_grad(set_to_none=True)
        self.task.loss(self.model, next(batches)).backward()
        return [p.grad.detach() for p in self.model.parameters()]  # type: ignore[union-attr]

    def eval_loss(self) -> float:
        return float(self.task.eval_loss(self.model))  # type: ignore[attr-defined]

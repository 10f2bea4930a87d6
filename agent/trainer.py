"""Local training between exchanges: a pseudo-gradient over ``local_steps`` optimizer steps."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from skyfed.fingerprint import TensorInfo, model_spec, weights_digest
from skyfed.tasks.base import Task


@dataclass(slots=True)
class LocalResult:
    """One round of local work: ``delta = start - end`` per parameter, and its cost."""

    delta: list[torch.Tensor]
    loss: float
    samples: int
    train_s: float


class LocalTrainer:
    """Owns the model replica; its parameters always equal the federation's weights
    between rounds (``train`` restores them), so every site starts a round bit-identical.
    """

    def __init__(
        self, task: Task, *, seed: int, shard: int, num_shards: int, local_steps: int
    ) -> None:
        self.task = task
        self.model = task.build_model(seed)
        named = list(self.model.named_parameters())
        self.spec: list[TensorInfo] = model_spec(named)
        self.params = [p for _, p in named]
        self.optimizer = task.make_optimizer(self.params)
        self.batches = task.batches(shard, num_shards, seed)
        self.local_steps = local_steps

    def train(self) -> LocalResult:
        started = time.perf_counter()
        start = [p.detach().clone() for p in self.params]
        losses = []
        self.model.train()
        for _ in range(self.local_steps):
            loss = self.task.loss(self.model, next(self.batches))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            losses.append(float(loss.detach()))
        with torch.no_grad():
            delta = [s - p for s, p in zip(start, self.params, strict=True)]
            for p, s in zip(self.params, start, strict=True):
                p.copy_(s)
        samples = self.local_steps * self.task.batch_size()
        return LocalResult(delta, sum(losses) / len(losses), samples, time.perf_counter() - started)

    @torch.no_grad()
    def apply(self, update: list[torch.Tensor]) -> None:
        """``w -= update``: the same float32 operation the coordinator performs."""
        for p, u in zip(self.params, update, strict=True):
            p.sub_(u)

    @torch.no_grad()
    def load(self, weights: list[torch.Tensor]) -> None:
        for p, w in zip(self.params, weights, strict=True):
            p.copy_(w)

    def digest(self) -> str:
        return weights_digest(p.detach() for p in self.params)

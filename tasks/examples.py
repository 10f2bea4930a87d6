"""Bring your own model: a complete task (model, TP plan, data, optimizer) to copy from.

Every site and the coordinator name the same factory::

    coordinator serve --task skyfed.tasks.examples:mlp_task ...
    agent start --task skyfed.tasks.examples:mlp_task --tp 2 ...

The model is plain single-device PyTorch; the sharding is only the plan in ``tp_plan``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(kw_only=True, slots=True)
class MLPTaskConfig:
    """Sizes and the inner optimizer's settings."""

    d_in: int = 32
    """Input features."""
    d_hidden: int = 128
    """Hidden width; TP splits it, so it must be divisible by ``tp``."""
    n_classes: int = 10
    """Output classes."""
    batch: int = 64
    """Samples per batch."""
    lr: float = 0.05
    """SGD learning rate."""
    momentum: float = 0.9
    """SGD momentum."""

    def __post_init__(self) -> None:
        for name in ("d_in", "d_hidden", "n_classes", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"MLPTaskConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0 or not 0 <= self.momentum < 1:
            raise ValueError(f"MLPTaskConfig lr={self.lr} momentum={self.momentum} out of range")


class MLP(nn.Module):
    """Two linear layers: the Megatron MLP pattern (first column-, second row-sharded)."""

    def __init__(self, cfg: MLPTaskConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_in, cfg.d_hidden)
        self.fc2 = nn.Linear(cfg.d_hidden, cfg.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))  # (B, n_classes)


class MLPTask:
    """Classify points labelled by a fixed random teacher network; shards draw disjoint
    streams of points, the held-out set its own."""

    name = "mlp-example"

    def __init__(self, cfg: MLPTaskConfig | None = None) -> None:
        self.cfg = cfg or MLPTaskConfig()
        gen = torch.Generator().manual_seed(1234)  # the "world": the same on every site
        self.teacher = torch.randn(self.cfg.d_in, self.cfg.n_classes, generator=gen)

    def build_model(self, seed: int = 0) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return MLP(self.cfg)

    def batches(self, shard: int, num_shards: int, seed: int = 0) -> Iterator[Batch]:
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard {shard} is outside 0..{num_shards - 1}")
        return self._points(torch.Generator().manual_seed(seed * 1000 + shard))

    def _points(self, gen: torch.Generator) -> Iterator[Batch]:
        while True:
            x = torch.randn(self.cfg.batch, self.cfg.d_in, generator=gen)  # (B, d_in)
            y = torch.tanh(x).matmul(self.teacher).argmax(dim=1)  # (B,)
            yield x, y

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    def make_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.cfg.lr, momentum=self.cfg.momentum)

    def tp_plan(self) -> dict[str, object]:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}

    def batch_size(self) -> int:
        return self.cfg.batch

    @torch.no_grad()
    def eval_loss(self, model: nn.Module) -> float:
        points = self._points(torch.Generator().manual_seed(999_999))
        return sum(float(self.loss(model, next(points))) for _ in range(4)) / 4


def mlp_task(**options: object) -> MLPTask:
    """The factory ``load_task("skyfed.tasks.examples:mlp_task", d_hidden=256)`` calls."""
    return MLPTask(MLPTaskConfig(**options))  # type: ignore[arg-type]

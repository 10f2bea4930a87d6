"""The task interface: what the agent needs from a model, its data and its optimizer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class Task(Protocol):
    """A model, its data and its optimizer, as one site trains them.

    Implement this to train your own model with skyfed: every site must build the same
    architecture (the coordinator checks a fingerprint of names, shapes and dtypes) and
    may bring its own data shard.
    """

    name: str

    def build_model(self, seed: int) -> nn.Module:
        """A freshly initialised model; the same ``seed`` gives the same weights."""
        ...

    def batches(self, shard: int, num_shards: int, seed: int) -> Iterator[Any]:
        """An endless, deterministic stream of training batches from one shard."""
        ...

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Scalar training loss of ``model`` on ``batch``."""
        ...

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        """The local (inner) optimizer a site runs between exchanges."""
        ...

    def eval_loss(self, model: nn.Module) -> float:
        """Loss on held-out data that no shard trains on."""
        ...

    def tp_plan(self) -> dict[str, Any]:
        """``parallelize_module`` plan for local tensor parallelism (module path -> style)."""
        ...

    def batch_size(self) -> int:
        """Samples per batch: the weight of a site's contribution in the mean."""
        ...

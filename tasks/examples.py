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


SIZE_SUFFIXES = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9}


def parse_size(text: str | int) -> int:
    """``"100M"`` -> 100_000_000; ``"25k"``, ``"1.5G"`` and plain integers too."""
    if isinstance(text, int):
        return text
    raw = str(text).strip()
    scale = SIZE_SUFFIXES.get(raw[-1:], 1)
    digits = raw[:-1] if raw[-1:] in SIZE_SUFFIXES else raw
    try:
        value = float(digits)
    except ValueError:
        raise ValueError(f"size {text!r} is not a number with an optional k/M/G suffix") from None
    return int(value * scale)


@dataclass(kw_only=True, slots=True)
class WideTaskConfig:
    """A model of about ``params`` parameters: ``layers`` square Linear layers."""

    params: int = 1_000_000
    """Target parameter count; the width is chosen so the model is within 1 % of it (from
    about 100k parameters on; ``layers * (w*w + w)`` with an even width ``w``)."""
    layers: int = 4
    """Square Linear layers (width x width weight plus a bias each)."""
    batch: int = 8
    """Samples per batch: small, so training stays cheap next to the exchange at 100M."""
    lr: float = 0.01
    """SGD learning rate (no momentum: the optimizer holds no model-sized state)."""
    seed: int = 4321
    """Seeds the synthetic data; every site generates the same world from it."""

    def __post_init__(self) -> None:
        self.params = parse_size(self.params)
        for name in ("params", "layers", "batch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"WideTaskConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.params < 4 * self.layers:
            raise ValueError(f"WideTaskConfig.params={self.params} is too small for {self.layers}")
        if not self.lr > 0:
            raise ValueError(f"WideTaskConfig.lr={self.lr} must be > 0")

    @property
    def width(self) -> int:
        """Width w with layers * (w*w + w) ~ params, even so TP=2 splits it."""
        w = ((1 + 4 * self.params / self.layers) ** 0.5 - 1) / 2
        return max(2, 2 * round(w / 2))


class Wide(nn.Module):
    """``layers`` square Linear layers with ReLU between: alternately column- and row-sharded."""

    def __init__(self, cfg: WideTaskConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(cfg.width, cfg.width) for _ in range(cfg.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == 0 else layer(F.relu(x))
        return x  # (B, width)


class WideTask:
    """Regress a fixed, cheap target (a rotation of the input's features, halved) from
    Gaussian inputs: a model of any size, with synthetic data from a seed and no download,
    for benchmarks of the exchange at scale (``bench/scale.py``, the WAN bench)."""

    name = "wide-example"

    def __init__(self, cfg: WideTaskConfig | None = None) -> None:
        self.cfg = cfg or WideTaskConfig()

    def build_model(self, seed: int = 0) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return Wide(self.cfg)

    def batches(self, shard: int, num_shards: int, seed: int = 0) -> Iterator[Batch]:
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard {shard} is outside 0..{num_shards - 1}")
        return self._points(torch.Generator().manual_seed(self.cfg.seed + seed * 1000 + shard))

    def _points(self, gen: torch.Generator) -> Iterator[Batch]:
        while True:
            x = torch.randn(self.cfg.batch, self.cfg.width, generator=gen)  # (B, width)
            yield x, 0.5 * x.roll(1, dims=1)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(model(x), y)

    def make_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.cfg.lr)

    def tp_plan(self) -> dict[str, object]:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {
            f"layers.{i}": ColwiseParallel() if i % 2 == 0 else RowwiseParallel()
            for i in range(self.cfg.layers)
        }

    def batch_size(self) -> int:
        return self.cfg.batch

    @torch.no_grad()
    def eval_loss(self, model: nn.Module) -> float:
        points = self._points(torch.Generator().manual_seed(self.cfg.seed + 999_999))
        return sum(float(self.loss(model, next(points))) for _ in range(4)) / 4


def wide(**options: object) -> WideTask:
    """``--task 'skyfed.tasks.examples:wide?params=100M'``: a model of about 100M parameters."""
    return WideTask(WideTaskConfig(**options))  # type: ignore[arg-type]

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

from skyfed.tasks.registry import TaskLoadError

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


@dataclass(kw_only=True, slots=True)
class DigitsTaskConfig:
    """Sizes and the inner optimizer's settings of the handwritten-digits CNN."""

    channels: int = 16
    """Filters of the first convolution; the second has twice as many."""
    batch: int = 32
    """Images per batch."""
    lr: float = 3e-3
    """Learning rate of the local AdamW."""
    held_out: float = 0.2
    """Fraction of the 1797 images kept out of training, for ``eval_loss``."""

    def __post_init__(self) -> None:
        for name in ("channels", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"DigitsTaskConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0 or not 0 < self.held_out < 1:
            raise ValueError(f"DigitsTaskConfig lr={self.lr} held_out={self.held_out} out of range")


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions with max-pooling, then a linear classifier: 8x8 -> 10."""

    def __init__(self, cfg: DigitsTaskConfig) -> None:
        super().__init__()
        c = cfg.channels
        self.conv1 = nn.Conv2d(1, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, 2 * c, 3, padding=1)
        self.head = nn.Linear(2 * c * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # (B, c, 4, 4)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # (B, 2c, 2, 2)
        return self.head(x.flatten(1))  # (B, 10)


class DigitsTask:
    """Classify real handwritten digits (scikit-learn's bundled ``load_digits``: 1797 8x8
    images from UCI, shipped inside the wheel, so no download): a second task on real data
    whose model (a CNN) shares nothing with the embedded transformer, so a benchmark's
    conclusion does not rest on one model. Shards are disjoint slices of a fixed shuffle of
    the training images; the held-out images are the same on every site."""

    name = "digits"

    def __init__(self, cfg: DigitsTaskConfig | None = None) -> None:
        self.cfg = cfg or DigitsTaskConfig()
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise TaskLoadError(
                "task digits needs scikit-learn: pip install 'skyfed[tasks]'"
            ) from None
        images, labels = load_digits(return_X_y=True)
        x = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0  # (N,1,8,8)
        y = torch.tensor(labels, dtype=torch.long)  # (N,)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1797))
        cut = int(len(y) * (1 - self.cfg.held_out))
        self.train = (x[order[:cut]], y[order[:cut]])
        self.test = (x[order[cut:]], y[order[cut:]])

    def build_model(self, seed: int = 0) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return DigitsCNN(self.cfg)

    def batches(self, shard: int, num_shards: int, seed: int = 0) -> Iterator[Batch]:
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard {shard} is outside 0..{num_shards - 1}")
        size = len(self.train[1]) // num_shards
        x, y = (t[shard * size : (shard + 1) * size] for t in self.train)
        return self._draws(x, y, torch.Generator().manual_seed(seed * 1000 + shard))

    def _draws(self, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> Iterator[Batch]:
        while True:
            pick = torch.randint(len(y), (self.cfg.batch,), generator=gen)
            yield x[pick], y[pick]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    def make_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=0.0)

    def batch_size(self) -> int:
        return self.cfg.batch

    @torch.no_grad()
    def eval_loss(self, model: nn.Module) -> float:
        """Cross-entropy over every held-out image (deterministic: no sampling)."""
        return float(self.loss(model, self.test))


def digits(**options: object) -> DigitsTask:
    """``--task skyfed.tasks.examples:digits``: a CNN on scikit-learn's real digits."""
    return DigitsTask(DigitsTaskConfig(**options))  # type: ignore[arg-type]

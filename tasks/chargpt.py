"""The embedded default task: a small byte-level transformer on Python's own help topics.

The text ships with every CPython (``pydoc_data.topics``, about 465 kB of English), so the
demo and the tests need no download. Byte-level tokens keep the vocabulary (256) and so the
model's shapes the same on every Python version.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256


@dataclass(kw_only=True, slots=True)
class CharTaskConfig:
    """Size of the model and of its batches."""

    n_layer: int = 2
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads; must divide ``d_model`` (and be divisible by the TP degree)."""
    d_model: int = 64
    """Width of the residual stream."""
    block: int = 64
    """Context length in bytes."""
    batch: int = 16
    """Sequences per batch."""
    lr: float = 3e-3
    """Learning rate of the local AdamW."""
    eval_batches: int = 8
    """Held-out batches averaged by ``eval_loss``."""

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "d_model", "block", "batch", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"CharTaskConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_head:
            raise ValueError(
                f"CharTaskConfig.d_model={self.d_model} is not divisible by n_head={self.n_head}"
            )
        if not self.lr > 0:
            raise ValueError(f"CharTaskConfig.lr must be > 0, got {self.lr}")


class Attention(nn.Module):
    """Causal self-attention with separate q/k/v projections, so each can be column-sharded.

    Head count is derived from the local width, so the same code runs on a TP shard that
    holds ``n_head / tp`` heads.
    """

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.head_dim = d_model // n_head
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # (B, nh, T, hs), nh = local heads
        q, k, v = (
            m(x).view(B, T, -1, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class CharGPT(nn.Module):
    def __init__(self, cfg: CharTaskConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, cfg.d_model)
        self.pos = nn.Embedding(cfg.block, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_head) for _ in range(cfg.n_layer))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, VOCAB, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = (
                    0.02 / math.sqrt(2 * cfg.n_layer)
                    if name.endswith(("proj.weight", "out.weight"))
                    else 0.02
                )
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))  # (B, T, VOCAB)


def corpus() -> torch.Tensor:
    """All pydoc topics in sorted order, as bytes. # (N,) uint8"""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


class CharTask:
    """Next-byte prediction; shards are contiguous slices of the text, the last 5 % held out."""

    name = "chargpt"

    def __init__(self, cfg: CharTaskConfig | None = None) -> None:
        self.cfg = cfg or CharTaskConfig()

    @cached_property
    def _split(self) -> tuple[torch.Tensor, torch.Tensor]:
        data = corpus().long()
        cut = int(len(data) * 0.95)
        return data[:cut], data[cut:]

    def build_model(self, seed: int = 0) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return CharGPT(self.cfg)

    def batches(
        self, shard: int, num_shards: int, seed: int = 0
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard {shard} is outside 0..{num_shards - 1}")
        train, _ = self._split
        size = len(train) // num_shards
        return self._windows(train[shard * size : (shard + 1) * size], seed * 1000 + shard)

    def _windows(
        self, data: torch.Tensor, seed: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        gen = torch.Generator().manual_seed(seed)
        T = self.cfg.block
        while True:
            start = torch.randint(len(data) - T - 1, (self.cfg.batch,), generator=gen)
            x = torch.stack([data[s : s + T] for s in start.tolist()])  # (B, T)
            y = torch.stack([data[s + 1 : s + T + 1] for s in start.tolist()])  # (B, T)
            yield x, y

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        logits = model(x)  # (B, T, VOCAB)
        return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))

    def make_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=0.0)

    def held_out(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The held-out windows, the same ones every time: two evaluations differ only by
        the weights."""
        _, held_out = self._split
        return self._windows(held_out, seed=12345)

    @torch.no_grad()
    def eval_loss(self, model: nn.Module) -> float:
        batches = self.held_out()
        losses = [float(self.loss(model, next(batches))) for _ in range(self.cfg.eval_batches)]
        return sum(losses) / len(losses)

    def tp_plan(self) -> dict[str, object]:
        """Megatron-style: q/k/v and the MLP's first layer column-wise, outputs row-wise."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        plan: dict[str, object] = {}
        for i in range(self.cfg.n_layer):
            for name in ("attn.q", "attn.k", "attn.v", "fc"):
                plan[f"blocks.{i}.{name}"] = ColwiseParallel()
            for name in ("attn.proj", "out"):
                plan[f"blocks.{i}.{name}"] = RowwiseParallel()
        return plan

    def batch_size(self) -> int:
        return self.cfg.batch

"""A Hugging Face Llama built from its config (no download), on the embedded task's text.

``--task 'skyfed.tasks.llama:llama?hidden=64&layers=2'``: a ``transformers``
``LlamaForCausalLM`` with random initial weights from the seed, trained on next-byte
prediction over Python's own help topics (the embedded task's data: byte-level tokens,
a vocabulary of 256), and sharded for ``--tp`` by the model's own
``base_model_tp_plan``. Needs the ``hf`` extra (``pip install 'skyfed[hf]'``) on every
site and on the coordinator, which builds the model too (its fingerprint, the held-out
evaluation, the export).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from skyfed.tasks.chargpt import VOCAB, CharTask, CharTaskConfig


@dataclass(kw_only=True, slots=True)
class LlamaTaskConfig:
    """The model's size, its batches and its local optimizer."""

    hidden: int = 64
    """Width of the residual stream (``hidden_size``)."""
    layers: int = 2
    """Decoder layers."""
    heads: int = 4
    """Attention heads; ``hidden`` and the TP degree must divide by it."""
    kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide ``heads``."""
    intermediate: int = 128
    """Width of each MLP."""
    block: int = 64
    """Context length in bytes."""
    batch: int = 16
    """Sequences per batch."""
    lr: float = 3e-3
    """Learning rate of the local AdamW."""
    eval_batches: int = 8
    """Held-out batches averaged by the evaluation."""

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "heads", "kv_heads", "intermediate", "block", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"LlamaTaskConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"LlamaTaskConfig: hidden={self.hidden} must divide by heads={self.heads}, "
                f"and heads by kv_heads={self.kv_heads}"
            )
        if not self.lr > 0:
            raise ValueError(f"LlamaTaskConfig.lr must be > 0, got {self.lr}")


class LlamaTask:
    """Next-byte prediction with a config-built ``LlamaForCausalLM``."""

    name = "llama"

    def __init__(self, cfg: LlamaTaskConfig | None = None) -> None:
        self.cfg = cfg or LlamaTaskConfig()
        # The text, its split and its windows are the embedded task's.
        self._text = CharTask(
            CharTaskConfig(block=self.cfg.block, batch=self.cfg.batch, eval_batches=1)
        )

    def model_config(self) -> Any:
        """The ``transformers.LlamaConfig`` every site and the coordinator build from."""
        from transformers import LlamaConfig

        c = self.cfg
        return LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=c.hidden,
            intermediate_size=c.intermediate,
            num_hidden_layers=c.layers,
            num_attention_heads=c.heads,
            num_key_value_heads=c.kv_heads,
            max_position_embeddings=c.block,
            tie_word_embeddings=False,
        )

    def build_model(self, seed: int = 0) -> nn.Module:
        from transformers import LlamaForCausalLM

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return LlamaForCausalLM(self.model_config())

    def batches(
        self, shard: int, num_shards: int, seed: int = 0
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self._text.batches(shard, num_shards, seed)

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        logits = model(input_ids=x).logits  # (B, T, VOCAB)
        return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))

    def make_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=0.0)

    def batch_size(self) -> int:
        return self.cfg.batch

    @torch.no_grad()
    def eval_metrics(self, model: nn.Module) -> dict[str, float]:
        """Held-out loss, its perplexity and next-byte accuracy, over fixed batches."""
        batches = self._text.held_out()
        losses, right, total = [], 0, 0
        for _ in range(self.cfg.eval_batches):
            x, y = next(batches)
            logits = model(input_ids=x).logits
            losses.append(float(F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))))
            right += int((logits.argmax(-1) == y).sum())
            total += y.numel()
        loss = sum(losses) / len(losses)
        return {"loss": loss, "perplexity": math.exp(loss), "accuracy": right / total}

    def eval_loss(self, model: nn.Module) -> float:
        return self.eval_metrics(model)["loss"]

    def tp_plan(self) -> dict[str, str]:
        """The model's own plan (``skyfed.tasks.hf.hf_tp_plan``: ``LlamaConfig``'s
        ``base_model_tp_plan``, q/k/v and the MLP's gate and up projections column-wise,
        the outputs row-wise, under ``model.``), read off a model on the meta device."""
        from skyfed.tasks.hf import hf_tp_plan

        with torch.device("meta"):
            return hf_tp_plan(self.build_model())


def llama(**options: object) -> LlamaTask:
    """``skyfed.tasks.llama:llama?hidden=128&layers=4``: the options of :class:`LlamaTaskConfig`."""
    return LlamaTask(LlamaTaskConfig(**options))  # type: ignore[arg-type]

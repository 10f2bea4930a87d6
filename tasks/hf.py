"""Hugging Face models as tasks: a model's own TP plan, and a causal LM built from a local
config for a federation whose sites run their own training script.

``hf_tp_plan(model)`` is what any task over a ``transformers`` model returns from its
``tp_plan()``: the plan the model ships (its config's ``base_model_tp_plan``) under the
path where the base model sits in the task's model. ``causal_lm`` is the coordinator's
task when the sites train with ``skyfed.Site`` or ``skyfed.hf.SkyfedCallback``: it builds
the model the sites build (fingerprint, export) from the same ``config.json``, with no
download, and holds no data of its own (docs/tutorial-hf.md). Needs the ``hf`` extra.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn


def hf_tp_plan(model: nn.Module) -> dict[str, str]:
    """``model``'s own TP plan, paths from ``model``'s root: its config's
    ``base_model_tp_plan`` under ``base_model_prefix`` (``model.`` in a
    ``LlamaForCausalLM``; none when ``model`` is the base model itself). Empty for a model
    that ships none (GPT-2). Build ``model`` under ``torch.device("meta")`` to read the plan
    of any size for free."""
    plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None) or {}
    prefix = getattr(model, "base_model_prefix", "")
    inside = bool(prefix) and isinstance(getattr(model, prefix, None), nn.Module)
    return {f"{prefix}.{path}" if inside else path: style for path, style in plan.items()}


class CausalLMTask:
    """A ``transformers`` causal language model from a local ``config.json`` (random
    initial weights from the seed): the model of a federation whose sites bring their
    own loop. It has no data, so ``agent start`` refuses it."""

    name = "hf-causal-lm"

    def __init__(self, config: str) -> None:
        self.config_dir = Path(config)
        if not (self.config_dir / "config.json").is_file():
            raise ValueError(
                f"task skyfed.tasks.hf:causal_lm: {self.config_dir}/config.json not found "
                "(write it with model.config.save_pretrained(DIR))"
            )

    def model_config(self) -> Any:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(self.config_dir, local_files_only=True)

    def build_model(self, seed: int = 0) -> nn.Module:
        from transformers import AutoModelForCausalLM

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return AutoModelForCausalLM.from_config(self.model_config())

    def tp_plan(self) -> dict[str, str]:
        with torch.device("meta"):
            return hf_tp_plan(self.build_model())

    def _own_loop_only(self) -> NoReturn:
        raise ValueError(
            f"task {self.name} ({self.config_dir}) only builds the model: its sites train "
            "with their own script (skyfed.Site or skyfed.hf.SkyfedCallback; "
            "docs/own-loop.md), not agent start"
        )

    def batches(self, shard: int, num_shards: int, seed: int) -> Iterator[Any]:
        self._own_loop_only()

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        self._own_loop_only()

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        self._own_loop_only()

    def batch_size(self) -> int:
        self._own_loop_only()


def causal_lm(config: str) -> CausalLMTask:
    """``skyfed.tasks.hf:causal_lm?config=DIR``: the model of ``DIR/config.json``."""
    return CausalLMTask(config)

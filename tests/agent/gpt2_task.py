"""A task whose plan is GPT-2's: transformers' ``Conv1D`` and a fused q/k/v projection
(tests/agent/test_agent_cli_errors.py: refused before any rank trains)."""

from __future__ import annotations

from torch import nn

from skyfed.tasks.chargpt import CharTask


class GPT2Task(CharTask):
    name = "gpt2"

    def build_model(self, seed: int = 0) -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=256, n_positions=64)
        return GPT2LMHeadModel(config)

    def tp_plan(self) -> dict[str, str]:
        return {"transformer.h.*.attn.c_attn": "colwise", "transformer.h.*.attn.c_proj": "rowwise"}


def make() -> GPT2Task:
    return GPT2Task()

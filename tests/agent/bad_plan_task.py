"""A task whose TP plan names a module its model lacks (tests/agent/test_agent_cli_errors.py)."""

from __future__ import annotations

from skyfed.tasks.chargpt import CharTask


class BadPlanTask(CharTask):
    def tp_plan(self) -> dict[str, object]:
        from torch.distributed.tensor.parallel import ColwiseParallel

        return {**super().tp_plan(), "blocks.9.attn.q": ColwiseParallel()}


def make() -> BadPlanTask:
    return BadPlanTask()

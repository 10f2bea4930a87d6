"""A task whose model cannot be built on one rank of a site (tests/agent/test_site_failure.py):
as a GPU that runs out of memory at start would fail."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from skyfed.tasks.examples import MLPTask

FAILING_RANK = 1


class FailingTask(MLPTask):
    def build_model(self, seed: int = 0) -> nn.Module:
        if dist.is_initialized() and dist.get_rank() == FAILING_RANK:
            raise RuntimeError("CUDA error: out of memory (a test's rank that cannot start)")
        return super().build_model(seed)


def make() -> FailingTask:
    return FailingTask()

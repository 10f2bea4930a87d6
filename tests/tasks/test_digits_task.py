"""The digits task: real handwritten digits from scikit-learn's wheel, a CNN on them."""

from __future__ import annotations

import sys

import pytest
import torch

from skyfed.tasks import load_task
from skyfed.tasks.registry import TaskLoadError

SPEC = "skyfed.tasks.examples:digits"


def test_digits_batches_repeat_per_seed_and_training_lowers_the_held_out_loss():
    task = load_task(SPEC)
    x0, _ = next(task.batches(0, 2, seed=0))
    assert x0.shape == (32, 1, 8, 8) and float(x0.min()) >= 0 and float(x0.max()) <= 1
    again, _ = next(task.batches(0, 2, seed=0))
    assert torch.equal(x0, again)  # deterministic per shard and seed
    model = task.build_model(seed=0)
    before = task.eval_loss(model)
    optimizer = task.make_optimizer(model.parameters())
    batches = task.batches(1, 2, seed=0)
    for _ in range(60):
        optimizer.zero_grad()
        task.loss(model, next(batches)).backward()
        optimizer.step()
    assert task.eval_loss(model) < 0.5 * before


def test_digits_without_scikit_learn_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # as if not installed
    with pytest.raises(TaskLoadError, match=r"pip install 'skyfed\[tasks\]'"):
        load_task(SPEC)

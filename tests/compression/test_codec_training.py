"""A short real training run with each codec (and error feedback) lands close to FP32.

Forty steps are early in training, where Top-k and EC-SGD lag FP32 the most (error
feedback delays what it does not send), so the heavy codecs are held to most of FP32's
progress; ``bench/convergence.py`` measures the final-loss goals on longer runs.
"""

from __future__ import annotations

import pytest
import torch

from skyfed.compression import Codec, ErrorFeedback, decode_add_payload, make_codec
from skyfed.tasks import load_task
from skyfed.tasks.base import Task

WORKERS = 2
STEPS = 40


def _task() -> Task:
    return load_task("chargpt", n_layer=1, d_model=32, n_head=2, block=32, batch=8)


def _train(codec: Codec) -> float:
    """Held-out loss after data-parallel training with compressed, fed-back gradients."""
    task = _task()
    model = task.build_model(0)
    optimizer = task.make_optimizer(model.parameters())
    streams = [task.batches(shard, WORKERS, 0) for shard in range(WORKERS)]
    feedback = [ErrorFeedback() for _ in range(WORKERS)]
    for _ in range(STEPS):
        total = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
        for stream, ef in zip(streams, feedback, strict=True):
            model.zero_grad(set_to_none=True)
            task.loss(model, next(stream)).backward()
            grads = [(name, p.grad) for name, p in model.named_parameters()]
            for name, payload in ef.encode(codec, grads):
                decode_add_payload(payload, total[name])
        for name, p in model.named_parameters():
            p.grad = total[name] / WORKERS
        optimizer.step()
    return task.eval_loss(model)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A model this small gains nothing from a second thread, and on a busy host the two
    threads' barriers wait on each other: one thread keeps the test fast and steady."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def initial_loss() -> float:
    task = _task()
    return task.eval_loss(task.build_model(0))


@pytest.fixture(scope="module")
def fp32_loss() -> float:
    return _train(make_codec("fp32"))


@pytest.mark.parametrize(("name", "tolerance"), [("fp16", 0.005), ("bf16", 0.01)])
def test_half_precision_training_matches_fp32(
    fp32_loss: float, name: str, tolerance: float
) -> None:
    loss = _train(make_codec(name))
    assert abs(loss / fp32_loss - 1) <= tolerance, f"{name}: {loss:.4f} vs fp32 {fp32_loss:.4f}"


@pytest.mark.parametrize(
    ("name", "params"),
    [("topk", {"density": 0.01}), ("ecsgd", {"bits": 2, "seed": 0}), ("ecsgd", {"bits": 1})],
)
def test_compressed_training_makes_most_of_fp32_progress(
    initial_loss: float, fp32_loss: float, name: str, params: dict
) -> None:
    loss = _train(make_codec(name, **params))
    progress = (initial_loss - loss) / (initial_loss - fp32_loss)
    assert progress >= 0.7, f"{name}: {loss:.4f}, fp32 {fp32_loss:.4f}, start {initial_loss:.4f}"

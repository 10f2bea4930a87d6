"""Held-out evaluation of the canonical weights, off the round's critical path.

The caller lends the live weights; a worker thread makes them a model's parameters (views:
no copy) and calls the task's ``eval_metrics`` (named metrics: loss, accuracy,
perplexity...) or, for a task without it, its ``eval_loss``, then hands them back
(``release``). The metrics are held to the wire's rules (``skyfed.wire``): a name or
value out of them is dropped with a warning. The round's
close waits for that before it changes them in place (``Federation.weights_read``), so an
evaluation reads one round's weights whole, and the coordinator spends no model-sized copy
on it: 400 MB of new memory at 100M parameters, and as much again for the next round's
uplinks, whose pooled memory the copy had to let go (docs/scale.md, The held-out evaluation).
The price: a task whose ``eval_loss`` outlasts the time to the next close holds that close
up by the difference (logged, ``close_waited_ms``). A later due round is evaluated once
the worker is free.

The model's parameters hold no memory of their own: the weights lent become them for the
evaluation, and they are emptied after it (docs/scale.md, Memory). Its buffers (a norm's
running statistics: not federated) stay as the model was built. ``eval_loss`` must not
change the parameters: one that does (in place, through torch) is logged as an error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from skyfed.tasks.base import Task
from skyfed.wire import valid_metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EvalResult:
    round: int
    """The round whose closed weights were evaluated."""
    loss: float
    """The held-out loss on them: ``metrics["loss"]`` (NaN where the task says none)."""
    seconds: float
    """How long the evaluation took (on the worker, not on any round)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Every named metric the task's evaluation gave (``loss`` among them)."""


class Evaluator:
    """Evaluates every ``every``-th round (and the final one) on one worker thread."""

    def __init__(
        self, task: Task, every: int, on_result: Callable[[EvalResult], None] | None = None
    ) -> None:
        self._measure = measure_of(task)
        self.every = every
        self._model = task.build_model(0) if self.enabled else None
        self._shapes = [] if self._model is None else [p.shape for p in self._model.parameters()]
        self._empty_parameters()
        self._on_result = on_result
        self._lock = threading.Lock()
        self._busy = False
        self._last_due = -1  # the last round index handed to the worker
        self.latest: EvalResult | None = None
        self.results: list[EvalResult] = []
        self._worker: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self._measure is not None and self.every > 0

    def due(self, round_: int, final: bool = False) -> bool:
        """True if ``round_`` should be evaluated and the worker is free to take it."""
        if not self.enabled or round_ <= self._last_due:
            return False
        # Due once another ``every`` rounds have closed since the last evaluation.
        crossed = (round_ + 1) // self.every > (self._last_due + 1) // self.every
        with self._lock:
            return not self._busy and (crossed or final)

    def submit(
        self,
        round_: int,
        weights: list[torch.Tensor],
        release: Callable[[], None] | None = None,
    ) -> None:
        """Evaluate ``weights`` of ``round_`` in the background, reading them in place;
        ``release`` is called once they are no longer read (before ``on_result``, and
        without any lock of the evaluator's held)."""
        with self._lock:
            self._busy, self._last_due = True, round_
        self._worker = threading.Thread(
            target=self._run, args=(round_, weights, release), name="eval", daemon=True
        )
        self._worker.start()

    def _empty_parameters(self) -> None:
        """Let go of the parameters' memory until the next evaluation hands its copy."""
        if self._model is not None:
            for p in self._model.parameters():
                p.data = torch.empty(0, dtype=p.dtype)

    def join(self, timeout: float | None = None) -> None:
        if self._worker is not None:
            self._worker.join(timeout)

    def _run(
        self, round_: int, weights: list[torch.Tensor], release: Callable[[], None] | None
    ) -> None:
        result = self.evaluate(round_, weights, release)
        with self._lock:
            self._busy = False
        if self._on_result is not None:
            self._on_result(result)

    def evaluate(
        self, round_: int, weights: list[torch.Tensor], release: Callable[[], None] | None = None
    ) -> EvalResult:
        """Evaluate ``weights`` of ``round_`` on this thread, reading them in place (the
        worker's call; the in-process simulation's, which has no round to hold up)."""
        started = time.monotonic()
        versions = [w._version for w in weights]  # torch's count of in-place changes
        try:
            if self._model is None or self._measure is None:
                raise RuntimeError("the task has neither eval_metrics nor eval_loss")
            with torch.no_grad():
                params = zip(self._model.parameters(), self._shapes, weights, strict=True)
                for p, shape, w in params:
                    p.data = w.to(p.dtype).view(shape)  # the weights themselves (or a cast)
            self._model.eval()
            metrics = bounded(self._measure(self._model), round_)
        except Exception:  # a task's own eval must not take the coordinator down
            log.exception("[Coordinator.Eval] round=%d failed", round_)
            metrics = {}
        finally:
            self._empty_parameters()
            changed = [i for i, w in enumerate(weights) if w._version != versions[i]]
            if release is not None:
                release()
        if changed:
            log.error(
                "[Coordinator.Eval] round=%d weights it was lent changed during eval_loss "
                "(in place, tensors %s): agents will resync to them",
                round_,
                changed,
            )
        loss = metrics.get("loss", float("nan"))
        result = EvalResult(round_, loss, time.monotonic() - started, metrics)
        with self._lock:
            self.latest = result
            self.results.append(result)
        log.info(
            "[Coordinator.Eval] round=%d eval_loss=%.4f seconds=%.2f metrics=%s",
            round_,
            loss,
            result.seconds,
            " ".join(f"{k}={v:.4g}" for k, v in metrics.items()) or "-",
        )
        return result


def measure_of(task: Task) -> Callable[[nn.Module], dict[str, Any]] | None:
    """The task's evaluation as named metrics: its ``eval_metrics``, or its ``eval_loss``
    as ``{"loss": ...}``; None for a task with neither."""
    eval_metrics = getattr(task, "eval_metrics", None)
    if eval_metrics is not None:
        return lambda model: dict(eval_metrics(model))
    eval_loss = getattr(task, "eval_loss", None)
    if eval_loss is not None:
        return lambda model: {"loss": float(eval_loss(model))}
    return None


def bounded(metrics: dict[str, Any], round_: int) -> dict[str, float]:
    """``metrics`` held to the wire's rules (``skyfed.wire.valid_metrics``): what
    breaks them is dropped, with a warning saying why."""
    scalars = {
        name: float(value) if isinstance(value, torch.Tensor) and value.numel() == 1 else value
        for name, value in metrics.items()
    }
    kept, dropped = valid_metrics(scalars)
    for why in dropped:
        log.warning("[Coordinator.Eval] round=%d metric dropped: %s", round_, why)
    return kept

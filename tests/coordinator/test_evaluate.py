"""Held-out evaluation runs beside the rounds, on the weights it was handed."""

from __future__ import annotations

import queue
import threading

import pytest
import torch

from skyfed.coordinator.evaluate import EvalResult, Evaluator
from skyfed.tasks import load_task

TASK = "skyfed.tasks.examples:mlp_task"


def test_evaluation_is_due_every_n_rounds_and_after_the_last():
    evaluator = Evaluator(load_task(TASK), every=5)
    assert not any(evaluator.due(r) for r in range(4)) and evaluator.due(4)
    evaluator._last_due = 4
    assert not evaluator.due(5) and not evaluator.due(8) and evaluator.due(9)
    assert evaluator.due(6, final=True)
    assert evaluator.due(11)  # round 9 was missed while the worker was busy: 11 goes instead
    evaluator._last_due = 11
    assert not evaluator.due(13) and evaluator.due(14)


def test_evaluation_runs_on_a_worker_and_reports_the_tasks_eval_loss():
    task = load_task(TASK)
    model = task.build_model(3)
    done = threading.Event()
    got: list[EvalResult] = []
    evaluator = Evaluator(task, every=1, on_result=lambda r: (got.append(r), done.set()))
    evaluator.submit(7, [p.detach().clone() for p in model.parameters()])
    assert done.wait(30)
    assert got[0].round == 7 and got[0].loss == task.eval_loss(model)
    assert evaluator.latest == got[0]


def test_a_tasks_eval_metrics_are_all_reported_and_held_to_the_wires_rules(caplog):
    task = load_task("skyfed.tasks.llama:llama?hidden=32&layers=1&heads=2&kv_heads=2&block=16")
    model = task.build_model(3)
    result = Evaluator(task, every=1).evaluate(4, [p.detach().clone() for p in model.parameters()])
    expected = task.eval_metrics(model)
    assert result.metrics == pytest.approx(expected) and set(expected) == {
        "loss",
        "perplexity",
        "accuracy",
    }
    assert result.loss == pytest.approx(expected["loss"])

    class Unruly:
        build_model = task.build_model

        def eval_metrics(self, model):
            return {"loss": torch.tensor(2.0), "top 1": 0.5, "ok": float("inf"), "fine": 1}

    result = Evaluator(Unruly(), every=1).evaluate(5, [p.detach() for p in model.parameters()])
    assert result.metrics == {"loss": 2.0, "fine": 1.0} and result.loss == 2.0
    assert "metric dropped: metric name 'top 1' must be printable with no space" in caplog.text


def test_a_task_without_eval_loss_is_never_evaluated():
    class NoEval:
        def build_model(self, seed):  # pragma: no cover - never called
            raise AssertionError

    evaluator = Evaluator(NoEval(), every=1)
    assert not evaluator.enabled and not evaluator.due(0, final=True)


def test_the_evaluation_model_holds_no_parameter_memory_between_evaluations():
    task = load_task(TASK)
    model = task.build_model(3)
    weights = [p.detach().clone() for p in model.parameters()]
    handed = [w.clone() for w in weights]
    done = threading.Event()
    got: list[EvalResult] = []
    evaluator = Evaluator(task, every=1, on_result=lambda r: (got.append(r), done.set()))
    held = lambda: sum(p.numel() for p in evaluator._model.parameters())  # noqa: E731
    assert held() == 0  # built for its structure and buffers; no weights until handed some
    evaluator.submit(2, handed)
    assert done.wait(30) and got[0].loss == task.eval_loss(model)
    evaluator.join(30)
    assert held() == 0
    assert all(torch.equal(h, w) for h, w in zip(handed, weights, strict=True))  # read only
    done.clear()
    evaluator.submit(3, [w * 0 for w in weights])  # the next copy, not the last one's
    assert done.wait(30) and got[1].loss == task.eval_loss(_zeroed(task.build_model(3)))


def _zeroed(model):
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


class _HeldEvaluation:
    """chargpt whose ``eval_loss`` reads the weights, waits for the test, reads them again."""

    entered = threading.Event()
    go = threading.Event()
    seen: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

    def __init__(self) -> None:
        self._task = load_task("chargpt")

    def __getattr__(self, name):
        return getattr(self._task, name)

    def eval_loss(self, model) -> float:
        before = [p.detach().clone() for p in model.parameters()]
        type(self).entered.set()
        type(self).go.wait(30)
        after = [p.detach().clone() for p in model.parameters()]
        type(self).seen.append((before, after))
        return 0.0


def held_evaluation() -> _HeldEvaluation:
    """The factory ``--task tests.coordinator.test_evaluate:held_evaluation`` calls."""
    return _HeldEvaluation()


def test_the_next_close_waits_for_an_evaluation_reading_the_live_weights(serve, raw_agent):
    """The evaluation reads the coordinator's own weights, not a copy: the next round's
    close, which changes them in place, must wait until it is done, or it would read half
    of one round and half of the next (``Federation.weights_read``)."""
    from .test_bad_input import contribution, deltas, join, send

    held = _HeldEvaluation
    held.entered.clear(), held.go.clear(), held.seen.clear()
    running = serve(
        min_agents=1, eval_every=1, task="tests.coordinator.test_evaluate:held_evaluation"
    )
    agent = raw_agent(running.port, "aws-1")
    join(agent, "aws", "aws-1")
    send(agent, *contribution(deltas(1)))
    assert agent.expect("receipt").receipt.accepted
    assert agent.expect("round_end").round_end.round == 0
    assert held.entered.wait(30)  # round 0's evaluation is reading the weights
    send(agent, *contribution(deltas(2), round=1))
    assert agent.expect("receipt").receipt.accepted
    with pytest.raises(queue.Empty):  # round 1 is complete but may not close yet
        agent.expect("round_end", timeout=1.5)
    held.go.set()
    assert agent.expect("round_end", timeout=30).round_end.round == 1
    before, after = held.seen[0]
    assert all(torch.equal(b, a) for b, a in zip(before, after, strict=True))

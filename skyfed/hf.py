"""A Hugging Face ``Trainer`` joins a federation by one callback (docs/tutorial-hf.md).

``SkyfedCallback`` is ``skyfed.Site`` driven by the ``Trainer``'s events: the site is built
when training begins (over the ``Trainer``'s model and optimizer, the federation's weights
loaded into the model), told after every optimizer step, given the evaluation's metrics,
and closed when training ends. Needs the ``hf`` extra (``transformers`` and the
``accelerate`` its ``Trainer`` runs on); nothing else in skyfed imports this module.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from skyfed.agent.script import ScriptSite
from skyfed.wire import valid_metrics

log = logging.getLogger(__name__)

NOT_REPORTED = ("_runtime", "_per_second", "epoch")
"""Evaluation results that time the evaluation rather than judge the model."""


class SkyfedCallback(TrainerCallback):
    """Add to a ``Trainer``'s callbacks to train as one site of a federation.

    Every ``local_steps`` optimizer steps the site exchanges ``start - now`` of the
    weights for the federation's update, applied into the model in place (the
    ``Trainer``'s optimizer and scheduler go on as they were). Training stops when the
    federation finishes (``control.should_training_stop``), the model then holding its
    final weights; a ``max_steps`` or epoch count the ``Trainer`` reaches first closes
    the site. The ``Trainer``'s evaluations (``eval_*``, less their timings) are reported
    to the coordinator with the next contribution.

    Args:
        **site: ``skyfed.Site``'s keyword arguments (``cloud``, ``coordinator``,
            ``certs``, ``local_steps``, ``rounds``, ``state_dir``...; docs/own-loop.md).
            ``samples_per_step`` defaults to the ``Trainer``'s samples per optimizer step
            on one device (its batch size times its gradient accumulation).
    """

    def __init__(self, **site: Any) -> None:
        self.options = site
        self.site: ScriptSite | None = None
        """The site, from the start of training to its end."""
        self._losses: list[torch.Tensor] = []
        self._hook: Any = None

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        **kwargs: Any,
    ) -> None:
        if model is None or optimizer is None:
            raise ValueError("SkyfedCallback needs the Trainer's model and optimizer")
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        options = {"samples_per_step": per_step, **self.options}
        self.site = ScriptSite(model, optimizer, **options)
        self._hook = model.register_forward_hook(self._record_loss)
        if self.site.finished:  # the federation had finished: its weights are the model's
            control.should_training_stop = True

    def _record_loss(self, module: nn.Module, inputs: Any, output: Any) -> None:
        """The training forward's loss (a model given labels returns it): each step's
        mean is the site's loss, with no extra sync (read once per phase)."""
        loss = getattr(output, "loss", None)
        if module.training and isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._losses.append(loss.detach())

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.site is None:
            return
        losses, self._losses = self._losses, []
        loss = torch.stack(losses).float().mean() if losses else None
        if not self.site.step(loss):
            control.should_training_stop = True

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if self.site is None or not metrics:
            return
        judged = {name: v for name, v in metrics.items() if not name.endswith(NOT_REPORTED)}
        kept, dropped = valid_metrics(judged)
        for why in dropped:
            log.warning("[Agent.Script] evaluation metric not reported: %s", why)
        self.site.report(kept)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.site is not None:
            self.site.close()

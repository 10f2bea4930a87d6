"""The task interface: what the agent needs from a model, its data and its optimizer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class Task(Protocol):
    """A model, its data and its optimizer, as one site trains them.

    Implement this to train your own model with skyfed (``--task package.module:factory``;
    see ``skyfed.tasks.examples`` for a complete one). Every site must build the same
    architecture (the coordinator checks a fingerprint of names, shapes and dtypes) and
    may bring its own data shard. The agent owns the loop: per local step it calls
    ``loss(model, batch)``, ``backward()`` and ``optimizer.step()``; per round it sends
    ``start - end`` of the weights and applies the federation's average.

    Optional methods, looked up by name:

    - ``tp_plan() -> dict[str, ParallelStyle | str]``: the ``parallelize_module`` plan for
      local tensor parallelism (module path, ``*`` for any one component -> ``ColwiseParallel()``
      / ``RowwiseParallel()`` / ..., or a Hugging Face style name such as ``"colwise"``:
      a ``transformers`` model's ``base_model_tp_plan`` maps straight across). Needed only
      to run with ``tp > 1`` (or on CUDA, where the plan runs on a mesh of one). Without a
      plan, ``tp > 1`` is refused; a plan the model cannot take is refused before any rank
      trains (``skyfed.tasks.plans``).
    - ``eval_metrics(model) -> dict[str, float]``: named metrics on held-out data (loss,
      accuracy, perplexity...), which the coordinator's evaluation runs on the
      federation's weights and reports (status, Prometheus, ``rounds.jsonl``, the report;
      docs/own-loop.md). ``loss`` among them is the held-out loss.
    - ``eval_loss(model) -> float``: loss on held-out data, for benchmarks and reports
      (the evaluation's ``{"loss": ...}`` for a task without ``eval_metrics``).

    A site that runs its own script (``skyfed.Site``) needs none of this: the coordinator's
    task then only has to build the same model (``skyfed.tasks.hf:causal_lm`` does for a
    ``transformers`` config).
    """

    name: str

    def build_model(self, seed: int) -> nn.Module:
        """A freshly initialised model on the CPU; the same ``seed`` gives the same weights.

        Write it for one device: the agent moves it to the rank's device and shards it.
        """
        ...

    def batches(self, shard: int, num_shards: int, seed: int) -> Iterator[Any]:
        """An endless, deterministic stream of training batches from one shard.

        Yield CPU tensors (or tuples, lists, dicts of them); the agent moves each batch to
        the rank's device. Every rank of a site reads the same stream; on a site of ``dp``
        data-parallel replicas, replica ``i`` trains on the ``i``-th of ``dp`` equal slices
        of each batch, every tensor in it cut along its first dimension (docs/sites.md).
        """
        ...

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Scalar training loss of ``model`` on ``batch``."""
        ...

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        """The local (inner) optimizer a site runs between exchanges.

        Pass ``params`` to a ``torch.optim`` optimizer as it is: the model's parameters,
        or under TP two param groups (sharded DTensors, replicated tensors), because
        multi-tensor kernels cannot mix the two. Options set per group stay yours.
        """
        ...

    def batch_size(self) -> int:
        """Samples per batch, the site's per local step whatever its data-parallel degree
        (which must divide it): with the local steps, the weight of a site's contribution
        in the mean."""
        ...


def tp_plan_of(task: Task) -> dict[str, Any]:
    """The task's TP plan as torch styles (Hugging Face's style names resolved,
    ``skyfed.tasks.plans``); an empty plan when it has none."""
    from skyfed.tasks.plans import resolve

    plan = getattr(task, "tp_plan", None)
    return {} if plan is None else resolve(plan())

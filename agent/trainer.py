"""A Task's local training between exchanges: a pseudo-gradient over ``local_steps`` of
its optimizer's steps on its batches, or (``exchange = "gradient"``) one momentum-corrected
gradient step. What every site does with its model besides is ``skyfed.agent.core``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from skyfed.agent.core import LocalResult, Steps, TrainerCore
from skyfed.agent.momentum import MomentumCorrection
from skyfed.agent.parallelize import (
    HSDP_DIMS,
    check_fsdp_dims,
    data_parallel,
    local_gradient,
    parallelize,
    param_groups,
    quiet_redistribute_warnings,
    replica_of,
    resolve_dp_mode,
)
from skyfed.fingerprint import model_spec
from skyfed.tasks.base import Task, tp_plan_of

__all__ = ["LocalResult", "LocalTrainer", "check_batch", "dp_slice", "to_device"]


class LocalTrainer(TrainerCore):
    """A Task's model, data and optimizer on this rank (``agent start``).

    With a ``mesh`` ("dp", "tp"; ``skyfed.agent.parallelize.build_mesh``) the model is
    sharded by the task's ``tp_plan()`` on "tp" and replicated on "dp" with FSDP2 or DDP
    (``dp_mode``); every method then works on the local shards, and :meth:`digest` is a
    collective over the mesh. Each data-parallel replica trains on its ``1/dp`` slice of
    every batch of the one stream a site of one rank would read, so the site's step is
    that site's step (for a mean loss, to float tolerance; docs/sites.md).
    """

    def __init__(
        self,
        task: Task,
        *,
        seed: int,
        shard: int,
        num_shards: int,
        local_steps: int,
        mesh: DeviceMesh | None = None,
        device: torch.device | None = None,
        data_seed: int | None = None,
        dp_mode: str = "auto",
    ) -> None:
        self.task = task
        self.task_name = task.name
        device = device or torch.device("cpu")
        model = task.build_model(seed)
        spec = model_spec(list(model.named_parameters()))  # logical shapes, before sharding
        model.to(device)
        self.dp_mode = "none"
        net = model
        if mesh is not None:
            net = self._parallelize(model, mesh, task, dp_mode, device)
        params = list(model.parameters())  # FSDP2 replaced them by their shards
        super().__init__(
            model,
            task.make_optimizer(param_groups(params)),
            local_steps=local_steps,
            net=net,
            mesh=mesh,
            spec=spec,
            seed=seed,
            device=device,
        )
        # The data order's seed: ``seed`` unless the site has its own (agent/launch.py).
        self.batches = task.batches(shard, num_shards, seed if data_seed is None else data_seed)
        check_batch(task.batch_size(), self.dp)

    def _parallelize(
        self, model: nn.Module, mesh: DeviceMesh, task: Task, dp_mode: str, device: torch.device
    ) -> nn.Module:
        """TP by the task's plan on "tp" (on a mesh of one rank too: a CUDA site's path),
        then data parallelism on "dp"; the module to run forward on."""
        dp, _ = replica_of(mesh)
        if mesh["tp"].size() > 1 or dp == 1:
            parallelize(model, mesh, tp_plan_of(task))
        if dp == 1:
            return model
        hsdp = HSDP_DIMS[0] in (mesh.mesh_dim_names or ())
        self.dp_mode = "hsdp" if hsdp else resolve_dp_mode(dp_mode, model, dp, device)
        if self.dp_mode in ("fsdp", "hsdp"):
            check_fsdp_dims(model, mesh[HSDP_DIMS[1]].size() if hsdp else dp)
            quiet_redistribute_warnings()
        return data_parallel(model, mesh, self.dp_mode)

    def _batch(self) -> Any:
        """This replica's slice of the site's next batch, on the device."""
        return to_device(dp_slice(next(self.batches), self.dp_rank, self.dp), self.device)

    def _site_samples(self) -> int:
        """The phase's samples, counted once for the site (on its rank 0)."""
        return self.local_steps * self.task.batch_size() if self.rank == 0 else 0

    def train(self) -> LocalResult:
        if self.momentum is not None:  # the weights do not move: a digest begun stays valid
            return self._gradient_step(self.momentum)
        return super().train()

    def _steps(self, settle: Callable[[], str | None]) -> Steps:
        losses = []
        self.net.train()
        for _ in range(self.local_steps):
            loss = self.task.loss(self.net, self._batch())
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            settle()
            self.optimizer.step()
            losses.append(float(loss.detach()))
            self.stepped()
        return Steps(losses, self._site_samples())

    def _gradient_step(self, momentum: MomentumCorrection) -> LocalResult:
        """The gradient over ``local_steps`` batches (their mean), through ``momentum``:
        ``delta`` is the momentum-SGD step ``lr * u``; the weights do not move here."""
        started = time.perf_counter()
        losses = []
        self.net.train()
        self.optimizer.zero_grad(set_to_none=True)
        for _ in range(self.local_steps):
            loss = self.task.loss(self.net, self._batch())
            (loss / self.local_steps).backward()
            losses.append(float(loss.detach()))
        local = [local_gradient(p) for p in self.params]  # every rank, every tensor
        gradients = [g if owned else None for g, owned in zip(local, self.owned, strict=True)]
        steps = momentum.step(gradients)
        delta = [None if s is None else s.cpu() for s in steps]
        return LocalResult(
            delta,
            sum(losses) / len(losses),
            self._site_samples(),
            time.perf_counter() - started,
        )


def check_batch(batch: int, dp: int) -> None:
    """A data-parallel site splits each batch evenly over its replicas (the mean of equal
    slices' gradients is the whole batch's): ValueError where ``dp`` does not divide it."""
    if dp > 1 and batch % dp:
        raise ValueError(
            f"dp={dp} does not divide the task's batch of {batch} samples: each replica "
            "takes an equal slice of every batch (choose a dp that divides it)"
        )


def dp_slice(batch: Any, index: int, count: int) -> Any:
    """Replica ``index`` of ``count``'s slice of ``batch``: every tensor in it (tuples,
    lists, dicts nest) cut along its first dimension into ``count`` equal parts; a
    0-d tensor or another object goes whole."""
    if count == 1:
        return batch
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            return batch
        part = batch.shape[0] // count
        return batch.narrow(0, index * part, part)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(dp_slice(b, index, count) for b in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(dp_slice(b, index, count) for b in batch)
    if isinstance(batch, dict):
        return {k: dp_slice(v, index, count) for k, v in batch.items()}
    return batch


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it (tuples, lists, dicts nest) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(b, device) for b in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch

"""Local training between exchanges: a pseudo-gradient over ``local_steps`` optimizer steps,
or (``exchange = "gradient"``) one momentum-corrected gradient step."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from skyfed.agent.momentum import MomentumCorrection
from skyfed.agent.parallelize import (
    HSDP_DIMS,
    check_fsdp_dims,
    data_parallel,
    full_tensor,
    layout_of,
    local_gradient,
    local_tensor,
    narrow,
    parallelize,
    param_groups,
    quiet_redistribute_warnings,
    replica_of,
    resolve_dp_mode,
)
from skyfed.compression import Codec, decode_add_payload, decode_payload
from skyfed.fingerprint import DigestStream, TensorInfo, model_spec, weights_digest
from skyfed.tasks.base import Task, tp_plan_of
from skyfed.wire import ShardCoords

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LocalResult:
    """One round of local work: ``delta = start - end`` per local shard, and its cost.

    ``delta[i]`` is None for a tensor this rank does not own (a slice another rank holds
    too: one of them speaks for every copy, ``skyfed.agent.parallelize.owns``).
    """

    delta: list[torch.Tensor | None]
    loss: float
    """The mean loss of its local steps; on a multi-rank site, this rank's until the site
    averages it over its ranks (``Site.train``)."""
    samples: int
    """The samples the site trained on: local steps x the task's batch, whatever its
    data-parallel degree (each replica took a slice of each batch)."""
    train_s: float


class LocalTrainer:
    """Owns this rank's part of the model; between rounds its parameters always equal the
    federation's weights (``train`` restores them), so every site starts a round
    bit-identical.

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
        self.seed = seed
        self.device = device or torch.device("cpu")
        model = task.build_model(seed)
        spec = model_spec(list(model.named_parameters()))  # logical shapes, before sharding
        model.to(self.device)
        self.rank = 0 if mesh is None else mesh.get_rank()
        self.dp, self.dp_rank = 1, 0
        self.dp_mode = "none"
        self.net = model
        """What a step's forward runs (the DDP wrapper, under DDP); ``model`` holds the
        parameters."""
        if mesh is not None:
            self.net = self._parallelize(model, mesh, task, dp_mode)
        self.model = model
        named = list(model.named_parameters())  # FSDP2 replaced them by their shards
        self.params = [p for _, p in named]
        layout = layout_of(named, self.rank, mesh, spec)
        self.spec: list[TensorInfo] = layout.spec
        self.shards: list[ShardCoords] = layout.shards
        self.owned = layout.owned
        self.optimizer = task.make_optimizer(param_groups(self.params))
        # The data order's seed: ``seed`` unless the site has its own (agent/launch.py).
        self.batches = task.batches(shard, num_shards, seed if data_seed is None else data_seed)
        self.local_steps = local_steps
        self.local_step = 0
        """Local steps done in the current phase (read by the progress line of a long one)."""
        self.steps_done = 0
        """Local steps done since the trainer was built."""
        self.after_step: Callable[[int], None] = lambda steps_done: None
        """Called after every local step with ``steps_done`` (GPU telemetry reads there)."""
        check_batch(task.batch_size(), self.dp)
        # Gradient exchange (set_exchange): the step to send comes from here, not from the
        # task's optimizer.
        self.momentum: MomentumCorrection | None = None
        self._decode_buffer = torch.empty(0)
        # The weights' digest begun by an apply (on the digest pool), and the digest once
        # known: both valid until the weights next change (every method that changes them
        # clears them; ``train`` puts the weights back, so it keeps what it finished).
        self._digest: DigestStream | None = None
        self._known: str | None = None
        # An aggregate being applied one payload at a time (start_apply .. finish_apply).
        self._applying: _Applying | None = None

    def _parallelize(
        self, model: nn.Module, mesh: DeviceMesh, task: Task, dp_mode: str
    ) -> nn.Module:
        """TP by the task's plan on "tp" (on a mesh of one rank too: a CUDA site's path),
        then data parallelism on "dp"; the module to run forward on."""
        self.dp, self.dp_rank = replica_of(mesh)
        if mesh["tp"].size() > 1 or self.dp == 1:
            parallelize(model, mesh, tp_plan_of(task))
        if self.dp == 1:
            return model
        hsdp = HSDP_DIMS[0] in (mesh.mesh_dim_names or ())
        self.dp_mode = "hsdp" if hsdp else resolve_dp_mode(dp_mode, model, self.dp, self.device)
        if self.dp_mode in ("fsdp", "hsdp"):
            check_fsdp_dims(model, mesh[HSDP_DIMS[1]].size() if hsdp else self.dp)
            quiet_redistribute_warnings()
        return data_parallel(model, mesh, self.dp_mode)

    def _batch(self) -> Any:
        """This replica's slice of the site's next batch, on the device."""
        return to_device(dp_slice(next(self.batches), self.dp_rank, self.dp), self.device)

    def train(self) -> LocalResult:
        if self.momentum is not None:  # the weights do not move: a digest begun stays valid
            return self._gradient_step(self.momentum)
        started = time.perf_counter()
        # The digest an apply began hashes the weights in place while the first step's
        # forward and backward run (they read the weights, never write them); it must end
        # before the first optimizer step. The weights are back to these at the end, so
        # the daemon's check of the last aggregate can wait until now (docs/wan.md).
        begun, known = self._digest, self._known
        self._digest = self._known = None
        start = [local_tensor(p).detach().clone() for p in self.params]
        losses = []
        self.net.train()
        for step in range(1, self.local_steps + 1):
            loss = self.task.loss(self.net, self._batch())
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if begun is not None:
                known, begun = begun.hexdigest(), None
            self.optimizer.step()
            losses.append(float(loss.detach()))
            self.local_step = step
            self.steps_done += 1
            self.after_step(self.steps_done)
        with torch.no_grad():
            delta = [
                _restore(p, s, owned)
                for s, p, owned in zip(start, self.params, self.owned, strict=True)
            ]
        del start
        self._known = begun.hexdigest() if begun is not None else known
        # The exchange that follows holds no gradients (their memory became the deltas).
        self.optimizer.zero_grad(set_to_none=True)
        samples = self.local_steps * self.task.batch_size()
        return LocalResult(delta, sum(losses) / len(losses), samples, time.perf_counter() - started)

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
        samples = self.local_steps * self.task.batch_size()
        return LocalResult(delta, sum(losses) / len(losses), samples, time.perf_counter() - started)

    def set_exchange(self, exchange: str, lr: float, momentum: float) -> None:
        """What ``train`` computes from now on, as the coordinator's welcome says. The
        velocity survives a reconnect to a federation with the same settings."""
        if exchange != "gradient":
            self.momentum = None
        elif self.momentum is None or (self.momentum.lr, self.momentum.momentum) != (lr, momentum):
            self.momentum = MomentumCorrection(lr, momentum)
            if self.rank == 0:
                log.info("[Agent.Exchange] gradient lr=%g momentum=%g", lr, momentum)

    def sent(self, sent: list[torch.Tensor | None], codec: Codec) -> None:
        """What this rank's last contribution carried, decoded, and its codec: under
        gradient exchange, coordinates a sparse codec sent restart their velocity."""
        if self.momentum is not None:
            self.momentum.mask(sent, codec)

    def _changing(self) -> None:
        """The weights are about to change: no digest of them holds any more."""
        self._digest = self._known = None
        self._applying = None

    @torch.no_grad()
    def apply(self, update: list[torch.Tensor]) -> None:
        """``w -= update`` on this rank's slices: the float32 operation the coordinator does."""
        self._changing()
        for p, u, shard in zip(self.params, update, self.shards, strict=True):
            local_tensor(p).sub_(narrow(u, shard).to(self.device))

    @torch.no_grad()
    def apply_encoded(self, datas: Sequence[bytes]) -> None:
        """``w -= D(c)`` for each tensor's payload, decoded straight into this rank's slice
        (``decode_add``): bit for bit :meth:`apply` of the decoded tensors, without them.

        A payload that does not decode raises ``PayloadError`` with the weights partly
        updated: the caller resyncs them from the coordinator.
        """
        self.start_apply()
        for i, data in enumerate(datas):
            self.apply_payload(i, data)
        self.finish_apply()

    def start_apply(self) -> None:
        """Begin :meth:`apply_encoded` one payload at a time, as each arrives
        (:meth:`apply_payload`, in any order), ended by :meth:`finish_apply`."""
        self._changing()
        # Rank 0 of a CPU site whose tensors are whole on it (one rank, or DDP): it can
        # hash each tensor as it lands; elsewhere the digest is a gather (digest()).
        solo = all(s is None for s in self.shards) and self.device.type == "cpu"
        solo = solo and self.rank == 0
        self._applying = _Applying(DigestStream() if solo else None, [False] * len(self.params))

    @torch.no_grad()
    def apply_payload(self, i: int, data: bytes) -> None:
        """``w[i] -= D(data)``, decoded into this rank's slice; ``PayloadError`` as
        :meth:`apply_encoded`. Tensors hash on the pool in order, as soon as every one
        before them is applied."""
        applying = self._applying
        if applying is None or applying.done[i]:
            raise RuntimeError(f"tensor {i} applied outside start_apply() or twice")
        p, shard, info = self.params[i], self.shards[i], self.spec[i]
        local = local_tensor(p)
        if shard is None and local.device.type == "cpu":
            decode_add_payload(data, local, -1.0)
        else:  # a rank's slice of a logical payload, or a GPU: decode once on the CPU
            full = decode_payload(data, out=self._scratch(info))
            local.sub_(narrow(full, shard).to(self.device))
        applying.done[i] = True
        while applying.hashed < len(applying.done) and applying.done[applying.hashed]:
            if applying.digest is not None:  # hashed on the pool while the next one decodes
                applying.digest.add(self.params[applying.hashed].detach())
            applying.hashed += 1

    def finish_apply(self) -> None:
        """Every tensor applied: the digest begun as they were is the weights'."""
        applying = self._applying
        if applying is None or applying.hashed != len(applying.done):
            raise RuntimeError("finish_apply() before every tensor was applied")
        self._applying = None
        self._digest = applying.digest

    @property
    def applying(self) -> bool:
        """Between :meth:`start_apply` and :meth:`finish_apply`: the weights are partly
        updated."""
        return self._applying is not None

    @torch.no_grad()
    def load_encoded(self, datas: Sequence[bytes]) -> None:
        """Replace the weights by the coordinator's payloads, decoded into place."""
        self._changing()
        for p, data, shard, info in zip(self.params, datas, self.shards, self.spec, strict=True):
            local = local_tensor(p)
            if shard is None and local.device.type == "cpu" and local.is_contiguous():
                decode_payload(data, out=local)
            else:
                local.copy_(narrow(decode_payload(data, out=self._scratch(info)), shard))

    def _scratch(self, info: TensorInfo) -> torch.Tensor:
        """A float32 CPU buffer of ``info``'s shape, reused for every tensor."""
        if self._decode_buffer.numel() < info.numel:
            self._decode_buffer = torch.empty(info.numel)
        return self._decode_buffer[: info.numel].view(info.shape)

    @torch.no_grad()
    def load(self, weights: list[torch.Tensor]) -> None:
        """Replace the weights by logical tensors (each rank copies its slices)."""
        self._changing()
        for p, w, shard in zip(self.params, weights, self.shards, strict=True):
            local_tensor(p).copy_(narrow(w, shard))

    @torch.no_grad()
    def digest(self) -> str:
        """sha256 of the full logical weights. Sharded tensors are all-gathered one at a
        time (weights, never gradients); only rank 0 hashes, the others return "".
        After :meth:`apply_encoded` on one CPU rank, the digest it started as it went, as
        long as the weights have not changed since (every method that changes them
        clears it; :meth:`train` puts them back)."""
        if self._known is None and self._digest is not None:
            self._known = self._digest.hexdigest()
        self._digest = None
        if self._known is not None:
            return self._known
        fulls = (full_tensor(p.detach()) for p in self.params)
        if self.rank == 0:
            return weights_digest(fulls)
        for _ in fulls:
            pass
        return ""


@dataclass(slots=True)
class _Applying:
    """An aggregate being applied payload by payload: which tensors are done, and the
    digest of the first ``hashed`` of them (None where the trainer cannot hash locally)."""

    digest: DigestStream | None
    done: list[bool]
    hashed: int = 0


def _restore(param: torch.Tensor, start: torch.Tensor, owned: bool) -> torch.Tensor | None:
    """Put ``start`` back into ``param`` and return ``start - end`` (None: not owned),
    on the CPU. The difference is written into the gradient's memory where it fits, so a
    round holds the model, its start and the gradients, never a fourth copy."""
    local = local_tensor(param)
    grad = None if param.grad is None else local_tensor(param.grad)
    fits = (
        owned
        and local.device.type == "cpu"
        and grad is not None
        and grad.shape == local.shape
        and grad.dtype == local.dtype
        and grad.is_contiguous()
    )
    if fits:
        delta = torch.sub(start, local, out=grad)
        param.grad = None  # the buffer is the delta's now, never accumulated into again
    else:
        delta = (start - local).cpu() if owned else None
    local.copy_(start)
    return delta


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

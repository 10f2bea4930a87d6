"""One rank's part of the federated model, whoever runs its local steps: its slices in
logical coordinates, a local phase's start and ``start - end``, the federation's updates
applied in place, the weights' digest.

Two front ends run the steps between exchanges: ``skyfed.agent.trainer.LocalTrainer``
(a Task's model, data and optimizer: ``agent start``) and
``skyfed.agent.script.ScriptTrainer`` (a user's own loop: ``skyfed.Site``). Everything else
a site does with its model, it does here, so both speak the protocol alike.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from skyfed.agent.momentum import MomentumCorrection
from skyfed.agent.parallelize import (
    full_tensor,
    layout_of,
    local_tensor,
    narrow,
    replica_of,
)
from skyfed.compression import Codec, decode_add_payload, decode_payload
from skyfed.fingerprint import DigestStream, TensorInfo, weights_digest
from skyfed.wire import EXCHANGES, ShardCoords

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LocalResult:
    """One round of local work: ``delta = start - end`` per local shard, and its cost.

    ``delta[i]`` is None for a tensor this rank does not own (a slice another rank holds
    too: one of them speaks for every copy, ``skyfed.agent.parallelize.owns``).
    """

    delta: list[torch.Tensor | None]
    loss: float
    """The mean loss of its local steps (NaN: none was told, a script's phase may not
    say); on a multi-rank site, this rank's until the site averages it over its ranks
    (``Site.train``)."""
    samples: int
    """The samples this rank counts toward the site's contribution (``Site.train`` sums
    them over the ranks): the site's whole count on one rank, each replica's on the
    first rank of its TP group."""
    train_s: float


@dataclass(slots=True)
class Steps:
    """What a front end's local steps tell the core: their losses and samples."""

    losses: list[float]
    samples: int


class TrainerCore(abc.ABC):
    """One rank's part of ``model``; between rounds its parameters always equal the
    federation's weights (:meth:`train` restores them), so every site starts a round
    bit-identical.

    ``model`` holds the parameters (after any TP, FSDP2 or DDP, which ``mesh`` describes:
    ``skyfed.agent.parallelize.layout_of`` reads each rank's slices); ``net`` is what a
    forward runs (a DDP wrapper), ``optimizer`` the local one. ``spec``: the logical spec
    taken before sharding (default: read from the parameters). Without a ``mesh``, the
    site is one rank, or ``world`` ranks that are each a data-parallel replica (DDP, or
    FSDP2 over the default group), this one being ``rank``.
    """

    exchanges: tuple[str, ...] = EXCHANGES
    """What :meth:`train` can contribute (the hello offers them)."""
    task_name: str = ""
    """What the hello says this site trains (free text: the coordinator checks the
    model's fingerprint, not this)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        local_steps: int,
        net: nn.Module | None = None,
        mesh: DeviceMesh | None = None,
        spec: list[TensorInfo] | None = None,
        seed: int = 0,
        device: torch.device | None = None,
        reuse_gradients: bool = True,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.model = model
        self.net = net if net is not None else model
        """What a step's forward runs (the DDP wrapper, under DDP); ``model`` holds the
        parameters."""
        self.optimizer = optimizer
        self.seed = seed
        self.device = device or torch.device("cpu")
        self.rank = rank if mesh is None else mesh.get_rank()
        self.dp, self.dp_rank = (world, rank) if mesh is None else replica_of(mesh)
        named = list(model.named_parameters())  # FSDP2 replaced them by their shards
        self.params = [p for _, p in named]
        layout = layout_of(named, self.rank, mesh, spec)
        self.spec: list[TensorInfo] = layout.spec
        self.shards: list[ShardCoords] = layout.shards
        self.owned = layout.owned
        self.local_steps = local_steps
        self.local_step = 0
        """Local steps done in the current phase (read by the progress line of a long one)."""
        self.steps_done = 0
        """Local steps done since the trainer was built."""
        self.after_step: Callable[[int], None] = lambda steps_done: None
        """Called after every local step with ``steps_done`` (GPU telemetry reads there)."""
        # Write a phase's delta into the gradients' memory where it fits (one model-sized
        # copy fewer); only where this object owns the gradients' life (not a user's DDP,
        # whose gradients may be views of its buckets).
        self._reuse_gradients = reuse_gradients
        # Gradient exchange (set_exchange): the step to send comes from there, not from
        # the optimizer.
        self.momentum: MomentumCorrection | None = None
        self._decode_buffer = torch.empty(0)
        # The weights' digest begun by an apply (on the digest pool), and the digest once
        # known: both valid until the weights next change (every method that changes them
        # clears them; ``train`` puts the weights back, so it keeps what it finished).
        self._digest: DigestStream | None = None
        self._known: str | None = None
        # An aggregate being applied one payload at a time (start_apply .. finish_apply).
        self._applying: _Applying | None = None

    # ---- a local phase -----------------------------------------------------------------

    def train(self) -> LocalResult:
        """One local phase (:meth:`_steps`), then ``start - end`` with the weights put back."""
        started = time.perf_counter()
        # The digest an apply began hashes the weights in place while the first step's
        # forward and backward run (they read the weights, never write them); it must end
        # before the first optimizer step (``settle``). The weights are back to these at
        # the end, so the daemon's check of the last aggregate can wait until now
        # (docs/wan.md).
        digest = _Settle(self._digest, self._known)
        self._digest = self._known = None
        start = [local_tensor(p).detach().clone() for p in self.params]
        self.local_step = 0
        steps = self._steps(digest.settle)
        with torch.no_grad():
            delta = [
                _restore(p, s, owned, self._reuse_gradients)
                for s, p, owned in zip(start, self.params, self.owned, strict=True)
            ]
        del start
        self._known = digest.settle()
        # The exchange that follows holds no gradients (their memory became the deltas).
        self.optimizer.zero_grad(set_to_none=True)
        loss = sum(steps.losses) / len(steps.losses) if steps.losses else float("nan")
        return LocalResult(delta, loss, steps.samples, time.perf_counter() - started)

    @abc.abstractmethod
    def _steps(self, settle: Callable[[], str | None]) -> Steps:
        """The phase's optimizer steps; ``settle()`` before the first one changes weights.
        The task's loop (``LocalTrainer``) or the user's script (``ScriptTrainer``)."""

    def stepped(self) -> None:
        """One local step done: the counters and the per-step hook."""
        self.local_step += 1
        self.steps_done += 1
        self.after_step(self.steps_done)

    def set_exchange(self, exchange: str, lr: float, momentum: float) -> None:
        """What ``train`` computes from now on, as the coordinator's welcome says. The
        velocity survives a reconnect to a federation with the same settings."""
        if exchange not in self.exchanges:
            raise ValueError(f"this site cannot contribute a {exchange!r} (only {self.exchanges})")
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

    # ---- the federation's weights --------------------------------------------------------

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
        if shard is None and local.device.type == "cpu" and local.dtype == torch.float32:
            decode_add_payload(data, local, -1.0)
        else:  # a rank's slice of a logical payload, a GPU, another dtype: decode on the CPU
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
            whole = shard is None and local.device.type == "cpu" and local.is_contiguous()
            if whole and local.dtype == torch.float32:
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


class _Settle:
    """The digest an apply began, finished once (``settle``), and the digest it gave."""

    def __init__(self, begun: DigestStream | None, known: str | None) -> None:
        self._begun, self._known = begun, known

    def settle(self) -> str | None:
        if self._begun is not None:
            self._known, self._begun = self._begun.hexdigest(), None
        return self._known


@dataclass(slots=True)
class _Applying:
    """An aggregate being applied payload by payload: which tensors are done, and the
    digest of the first ``hashed`` of them (None where the trainer cannot hash locally)."""

    digest: DigestStream | None
    done: list[bool]
    hashed: int = 0


def _restore(
    param: torch.Tensor, start: torch.Tensor, owned: bool, reuse_gradients: bool
) -> torch.Tensor | None:
    """Put ``start`` back into ``param`` and return ``start - end`` (None: not owned),
    as float32 on the CPU. The difference is written into the gradient's memory where it
    fits and ``reuse_gradients`` allows, so a round holds the model, its start and the
    gradients, never a fourth copy."""
    local = local_tensor(param)
    grad = None if param.grad is None else local_tensor(param.grad)
    fits = (
        reuse_gradients
        and owned
        and local.device.type == "cpu"
        and local.dtype == torch.float32
        and grad is not None
        and grad.shape == local.shape
        and grad.dtype == local.dtype
        and grad.is_contiguous()
    )
    delta: torch.Tensor | None
    if fits:
        assert grad is not None
        delta = torch.sub(start, local, out=grad)
        param.grad = None  # the buffer is the delta's now, never accumulated into again
    else:
        delta = (start.float() - local.float()).cpu() if owned else None
    local.copy_(start)
    return delta

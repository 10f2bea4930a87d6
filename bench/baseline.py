"""Per-step FP32 data-parallel training: the baseline the convergence benches hold skyfed
against. It is not skyfed and runs none of its code: every step, every site's gradient is
averaged in FP32 and the task's optimizer steps on the mean, as DDP's all-reduce does;
in one process (:class:`DataParallel`), or as real processes on a Gloo group
(:func:`gloo_data_parallel`, bench/time_to_target.py's clock).

Its bytes are counted as the benches always counted them, so figures across runs compare:
per step, every site's FP32 gradient up and the FP32 mean down to every site, each as
the FP32 payload skyfed's own FP32 codec would frame (``make_codec("fp32")``).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from skyfed.compression import frame, make_codec
from skyfed.tasks import load_task
from skyfed.tasks.base import Task


def fp32_payload_bytes(model: nn.Module) -> tuple[int, int]:
    """One full-model FP32 payload's bytes, and of those its frames' headers."""
    fp32 = make_codec("fp32")
    payloads = [bytes(fp32.encode(p.detach())) for p in model.parameters()]
    return sum(map(len, payloads)), sum(map(frame.header_length, payloads))


class DataParallel:
    """``sites`` data-parallel replicas of ``task``'s model as one model (they are
    identical every step): site ``i`` draws shard ``i`` of ``sites`` with ``order_seed``,
    as a skyfed site of that shard and seed does."""

    def __init__(self, task: Task, seed: int, sites: int, order_seed: int | None = None) -> None:
        self.task = task
        self.model = task.build_model(seed)
        self.optimizer = task.make_optimizer(self.model.parameters())
        data_seed = seed if order_seed is None else order_seed
        self.batches: list[Iterator[Any]] = [
            task.batches(i, sites, data_seed) for i in range(sites)
        ]
        payload, framing = fp32_payload_bytes(self.model)
        self.step_bytes = 2 * sites * payload
        """Bytes one step puts on the wire: every site's gradient up, the mean down."""
        self.step_framing = 2 * sites * framing
        self.steps = 0

    @property
    def bytes(self) -> int:
        """Bytes on the wire over the steps so far."""
        return self.steps * self.step_bytes

    @property
    def framing(self) -> int:
        return self.steps * self.step_framing

    def step(self) -> None:
        """One step: each site's gradient on its next batch, their mean, the optimizer."""
        gradients = [self.gradient(batches) for batches in self.batches]
        for i, p in enumerate(self.model.parameters()):
            p.grad = sum(g[i] for g in gradients) / len(gradients)  # type: ignore[assignment]
        self.optimizer.step()
        self.steps += 1

    def gradient(self, batches: Iterator[Any]) -> list[torch.Tensor]:
        """The gradient of the loss on the next batch of ``batches``, per parameter."""
        self.model.zero_grad(set_to_none=True)
        self.task.loss(self.model, next(batches)).backward()
        return [p.grad.detach() for p in self.model.parameters()]  # type: ignore[union-attr]

    def eval_loss(self) -> float:
        return float(self.task.eval_loss(self.model))  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class GlooResult:
    """One data-parallel run of real processes: its held-out loss and what it cost."""

    steps: int
    wall_s: float
    """From the first step's start to the last step's end, the slowest rank's."""
    allreduce_s: float
    """Of ``wall_s``, the slowest rank's time inside the all-reduce (waits included)."""
    loss: float
    """The held-out loss after the last step (``task.eval_loss``, rank 0's model)."""
    bytes: int
    """Bytes as :class:`DataParallel` counts them (FP32 up and down per site and step)."""


def gloo_data_parallel(
    task_spec: str, seed: int, sites: int, steps: int, *, port: int = 0
) -> GlooResult:
    """Per-step FP32 data-parallel as DDP runs it: ``sites`` processes of one thread each,
    a torch.distributed Gloo group over loopback, every step each site's gradient on its
    own batches (shard ``i`` of ``sites``, as :class:`DataParallel`) all-reduced into the
    mean in one flat buffer (DDP's bucket, for a model this small), then the task's
    optimizer. ``port``: the rendezvous's (0: a free one)."""
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    port = port or _free_port()
    args = (sites, port, task_spec, seed, steps, out)
    procs = [ctx.Process(target=_gloo_rank, args=(rank, *args)) for rank in range(sites)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=3600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    failed = [r for r in results if isinstance(r, str)]
    if failed:
        raise RuntimeError(f"a data-parallel rank failed: {failed[0]}")
    model = load_task(task_spec).build_model(seed)
    step_bytes = 2 * sites * fp32_payload_bytes(model)[0]
    loss = next(r[3] for r in results if r[0] == 0)
    wall = max(r[1] for r in results)
    return GlooResult(steps, wall, max(r[2] for r in results), loss, steps * step_bytes)


def _gloo_rank(
    rank: int, world: int, port: int, spec: str, seed: int, steps: int, out: Any
) -> None:
    """One data-parallel site: its steps, timed; rank 0 evaluates at the end."""
    try:
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        url = f"tcp://127.0.0.1:{port}"
        dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world)
        task = load_task(spec)
        model = task.build_model(seed)
        optimizer = task.make_optimizer(model.parameters())
        batches = task.batches(rank, world, seed)
        params = list(model.parameters())
        flat = torch.zeros(sum(p.numel() for p in params))  # (numel,) the gradient bucket
        dist.barrier()
        started, allreduce_s = time.perf_counter(), 0.0
        for _ in range(steps):
            model.zero_grad(set_to_none=True)
            task.loss(model, next(batches)).backward()
            torch.cat([p.grad.reshape(-1) for p in params], out=flat)  # type: ignore[union-attr]
            began = time.perf_counter()
            dist.all_reduce(flat)  # the sum over sites, in place
            allreduce_s += time.perf_counter() - began
            flat.div_(world)
            offset = 0
            for p in params:
                p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            optimizer.step()
        dist.barrier()
        wall_s = time.perf_counter() - started
        loss = float(task.eval_loss(model)) if rank == 0 else math.nan  # type: ignore[attr-defined]
        dist.destroy_process_group()
        out.put((rank, wall_s, allreduce_s, loss))
    except Exception as exc:  # the parent says which rank failed, and why
        out.put(f"rank {rank}: {exc!r}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

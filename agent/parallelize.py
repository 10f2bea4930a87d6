"""Local tensor parallelism: the device mesh, the task's plan applied, each parameter's shard.

The sharding lives here and only here: the model code stays single-device, the task names
its plan (module path -> ``ColwiseParallel()`` / ``RowwiseParallel()`` / ...), and this
module turns every parameter into a DTensor on a 1-D ``tp`` mesh. What the federation
sees of a parameter is its logical (unsharded) shape plus, per rank, the slice it owns.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import parallelize_module

from skyfed.wire import ShardCoords


def build_mesh(device_type: str, tp: int) -> DeviceMesh:
    """A 1-D mesh over the default process group's ``tp`` ranks."""
    return init_device_mesh(device_type, (tp,), mesh_dim_names=("tp",))


def parallelize(model: nn.Module, mesh: DeviceMesh, plan: dict[str, Any]) -> nn.Module:
    """Apply ``plan`` in place; parameters it names become DTensors, the rest stay replicated."""
    if mesh.size() > 1 and not plan:
        raise ValueError(
            f"tp={mesh.size()} needs a task with a tp_plan(); this one has none (use tp=1)"
        )
    check_plan(model, plan)
    return parallelize_module(model, mesh, plan)


def check_plan(model: nn.Module, plan: dict[str, Any]) -> None:
    """ValueError naming the first module ``plan`` names that ``model`` lacks (torch's own
    error for it is a traceback deep inside ``parallelize_module``)."""
    names = {name for name, _ in model.named_modules()}
    for path in plan:
        if "*" not in path and path not in names:
            raise ValueError(
                f"the task's tp_plan() names module {path!r}, which the model lacks; fix the "
                "plan or run with --tp 1"
            )


def param_groups(params: list[nn.Parameter]) -> list[nn.Parameter] | list[dict[str, Any]]:
    """What to hand the task's optimizer: the parameters, or under TP one param group of
    DTensors and one of plain tensors, since multi-tensor (foreach) kernels, CUDA's
    default, refuse a list that mixes the two."""
    sharded = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    if not sharded or not plain:
        return params
    return [{"params": sharded}, {"params": plain}]


def local_tensor(param: torch.Tensor) -> torch.Tensor:
    """The storage this rank holds: a DTensor's local shard, or the tensor itself."""
    return param.to_local() if isinstance(param, DTensor) else param


def local_gradient(param: torch.Tensor) -> torch.Tensor:
    """This rank's slice of ``param``'s gradient, placed like ``param``; zeros if the loss
    did not use it.

    With the plans tried, DTensor's backward already places a gradient like its parameter
    (a replicated one reduced); a plan that leaves one partial gets it reduced here, a
    collective: every rank must call this for every parameter, in the same order."""
    grad = param.grad
    if grad is None:
        return torch.zeros_like(local_tensor(param.detach()))
    distributed = isinstance(param, DTensor) and isinstance(grad, DTensor)
    if distributed and grad.placements != param.placements:
        grad = grad.redistribute(param.device_mesh, param.placements)
    return local_tensor(grad.detach())


def full_tensor(param: torch.Tensor) -> torch.Tensor:
    """The logical tensor; a collective on the mesh when ``param`` is sharded."""
    return param.full_tensor() if isinstance(param, DTensor) else param


def shard_of(param: torch.Tensor) -> ShardCoords:
    """``(dim, offset, length)`` of this rank's slice in logical coordinates; None: whole.

    Shards follow ``torch.chunk``: ranks hold ``ceil(n / tp)`` rows each, the last ones
    fewer or none (length 0). Only 1-D meshes and Shard/Replicate placements occur here.
    """
    if not isinstance(param, DTensor):
        return None
    mesh, (placement,) = param.device_mesh, param.placements
    if isinstance(placement, Replicate):
        return None
    if not isinstance(placement, Shard):
        raise ValueError(f"parameter placement {placement} is neither Shard nor Replicate")
    dim = placement.dim % param.dim()
    n, world, rank = param.shape[dim], mesh.size(), mesh.get_local_rank()
    size = -(-n // world)
    offset = min(rank * size, n)
    length = min(n, offset + size) - offset
    local_length = param.to_local().shape[dim]
    if local_length != length:
        raise ValueError(f"rank {rank} holds {local_length} of dim {dim}, expected {length}")
    return dim, offset, length


def narrow(full: torch.Tensor, shard: ShardCoords) -> torch.Tensor:
    """The slice ``shard`` of a logical tensor (a view)."""
    return full if shard is None else full.narrow(shard[0], shard[1], shard[2])

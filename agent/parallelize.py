"""A site's parallelism: the ("dp", "tp") device mesh, the task's TP plan, data parallelism
(FSDP2 or DDP) on "dp", and each parameter's slice in logical coordinates.

The sharding lives here and only here: the model code stays single-device, the task names
its TP plan (module path -> ``ColwiseParallel()`` / ``RowwiseParallel()`` / ...), and this
module turns parameters into DTensors. What the federation sees of a parameter is its
logical (unsharded) shape plus, per rank, the one interval along one dimension that the
rank owns and encodes (docs/sites.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from skyfed.agent.config import DP_MODES
from skyfed.fingerprint import TensorInfo, model_spec
from skyfed.tasks.plans import check as check_plan
from skyfed.wire import ShardCoords

log = logging.getLogger(__name__)

AUTO_DDP_MAX_FRACTION = 0.25
"""``auto`` takes DDP while the parameters, their gradients and two optimizer moments
(16 bytes per fp32 parameter) take at most this share of one rank's memory (docs/sites.md)."""


HSDP_DIMS = ("dp_replicate", "dp_shard")


def build_mesh(device_type: str, dp: int, tp: int, dp_shard: int = 0) -> DeviceMesh:
    """The site's mesh over the default group's ``dp * tp`` ranks, row-major: rank ``r`` is
    data-parallel replica ``r // tp`` and tensor-parallel rank ``r % tp``, so a TP group is
    ``tp`` consecutive ranks (one node's GPUs under srun and torchrun).

    2-D ("dp", "tp"), or for HSDP (``0 < dp_shard < dp``) 3-D: the replicas as
    ("dp_replicate", "dp_shard") groups of ``dp_shard`` consecutive ones (a node's)."""
    if 0 < dp_shard < dp:
        shape = (dp // dp_shard, dp_shard, tp)
        return init_device_mesh(device_type, shape, mesh_dim_names=(*HSDP_DIMS, "tp"))
    return init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))


def replicas(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh of the site's data-parallel replicas: "dp", or HSDP's two dimensions."""
    return mesh[HSDP_DIMS] if HSDP_DIMS[0] in (mesh.mesh_dim_names or ()) else mesh["dp"]


def replica_of(mesh: DeviceMesh) -> tuple[int, int]:
    """``(replicas, this rank's replica)``, the replica counted row-major over the
    replicas' mesh (the slice of each batch it trains on)."""
    dp_mesh = replicas(mesh)
    index = 0
    for dim, coord in enumerate(dp_mesh.get_coordinate() or [0] * dp_mesh.ndim):
        index = index * dp_mesh.size(dim) + coord
    return dp_mesh.size(), index


def parallelize(model: nn.Module, mesh: DeviceMesh, plan: dict[str, Any]) -> nn.Module:
    """Apply the TP ``plan`` on ``mesh``'s "tp" dimension in place; parameters it names
    become DTensors, the rest stay plain (replicated). A 1-D mesh is taken as "tp" itself."""
    tp_mesh = _tp_mesh(mesh)
    check_plan(model, plan, tp_mesh.size())  # the preflight's check, for a library caller too
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, tp_mesh, plan)


def _tp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    names = mesh.mesh_dim_names or ()
    return mesh["tp"] if mesh.ndim > 1 and "tp" in names else mesh


def resolve_dp_mode(mode: str, model: nn.Module, dp: int, device: torch.device) -> str:
    """``fsdp``, ``hsdp`` or ``ddp`` for ``mode``; ``auto`` picks DDP while a whole
    replica's training state fits in a quarter of one rank's memory (faster: no all-gather
    of the weights in every forward), FSDP2 beyond (memory per rank falls with ``dp``)."""
    if mode != "auto" or dp == 1:
        return "fsdp" if mode == "auto" else mode
    state_bytes = 16 * sum(p.numel() for p in model.parameters())
    return "ddp" if state_bytes <= AUTO_DDP_MAX_FRACTION * memory_bytes(device) else "fsdp"


def memory_bytes(device: torch.device) -> int:
    """One rank's memory: its GPU's, or on CPU the host's shared by its ranks (counted as
    the host's whole memory: ranks on one host share it, which the fraction allows for)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def data_parallel(model: nn.Module, mesh: DeviceMesh, mode: str) -> nn.Module:
    """Replicas on ``mesh["dp"]`` that sync gradients (their mean) in every backward; the
    module to call forward on.

    ``fsdp``: FSDP2's ``fully_shard`` on each element of the model's ``ModuleList`` s (the
    blocks) and on the root; a TP-sharded parameter is sharded on its TP dimension again,
    so each rank's slice stays one interval of the logical tensor. ``hsdp``: the same on
    HSDP's two dimensions (sharded within a "dp_shard" group, replicated across them).
    ``ddp``: torch's ``DistributedDataParallel`` when there is no TP (its parameters are
    plain tensors), and FSDP2's ``replicate`` (DDP on FSDP2's machinery, which takes
    DTensors) with TP.
    """
    dp_mesh = replicas(mesh)
    if mode in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import fully_shard

        for unit in _blocks(model):
            fully_shard(unit, mesh=dp_mesh, shard_placement_fn=_same_dim_as_tp)
        fully_shard(model, mesh=dp_mesh, shard_placement_fn=_same_dim_as_tp)
        return model
    if mode != "ddp":
        raise ValueError(f"dp_mode {mode!r} is not one of {DP_MODES}")
    if mesh["tp"].size() == 1:
        from torch.nn.parallel import DistributedDataParallel

        cuda = mesh.device_type == "cuda"
        return DistributedDataParallel(
            model,
            process_group=dp_mesh.get_group(),
            device_ids=[torch.cuda.current_device()] if cuda else None,
        )
    replicate = _fsdp_replicate()
    for unit in _blocks(model):
        replicate(unit, mesh=dp_mesh)
    replicate(model, mesh=dp_mesh)
    return model


def _fsdp_replicate() -> Any:
    try:
        from torch.distributed._composable.replicate_with_fsdp import replicate
    except ImportError:
        raise ValueError(
            f"dp_mode 'ddp' with tp > 1 needs FSDP2's replicate (torch >= 2.9; this is "
            f"{torch.__version__}): torch's DistributedDataParallel refuses DTensor "
            "parameters; use dp_mode 'fsdp'"
        ) from None
    return replicate


def quiet_redistribute_warnings() -> None:
    """Gathering an FSDP x TP weight whose two splits share a dimension takes two
    all-gathers, which DTensor warns about on every gather; the digest gathers each weight
    once per round (docs/sites.md), so that warning would repeat for every tensor."""
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def _blocks(model: nn.Module) -> list[nn.Module]:
    """FSDP's units below the root: the elements of every ``ModuleList`` (a transformer's
    blocks), outermost lists only, bottom-up as ``fully_shard`` wants them."""
    units: list[nn.Module] = []
    inside: set[str] = set()
    for name, module in model.named_modules():
        if any(name.startswith(f"{outer}.") for outer in inside):
            continue
        if isinstance(module, nn.ModuleList):
            inside.add(name)
            units.extend(m for m in module if any(True for _ in m.parameters()))
    return units


def _same_dim_as_tp(param: nn.Parameter) -> Shard:
    """FSDP shards a TP-sharded parameter along its TP dimension (one interval per rank
    in logical coordinates, which the coordinator's aggregate takes), others along dim 0
    (:func:`check_fsdp_dims` first refuses what FSDP2 cannot split)."""
    if isinstance(param, DTensor):
        for placement in param.placements:
            if isinstance(placement, Shard):
                dim = placement.dim % param.dim()
                return Shard(dim)
    return Shard(0)


def check_fsdp_dims(model: nn.Module, dp: int) -> None:
    """ValueError for a TP-sharded parameter whose TP slice FSDP2 cannot split ``dp``
    ways (its shard group's size) along the same dimension (it shards a dimension other
    than 0 only evenly)."""
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            continue
        dim = _same_dim_as_tp(param).dim
        local = param.to_local().shape[dim]
        if dim != 0 and local % dp:
            raise ValueError(
                f"dp_mode 'fsdp': {name}'s TP slice has {local} along dim {dim}, which dp={dp} "
                "does not divide (FSDP2 splits a dimension other than 0 only evenly): choose "
                "a dp that divides it, or dp_mode 'ddp'"
            )


def param_groups(params: list[nn.Parameter]) -> list[nn.Parameter] | list[dict[str, Any]]:
    """What to hand the task's optimizer: the parameters, or under TP one param group of
    DTensors and one of plain tensors, since multi-tensor (foreach) kernels, CUDA's
    default, refuse a list that mixes the two."""
    sharded = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    if not sharded or not plain:
        return params
    groups: list[dict[str, Any]] = [{"params": sharded}, {"params": plain}]
    return groups


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
    if distributed and grad.placements != param.placements:  # type: ignore[attr-defined]
        grad = grad.redistribute(param.device_mesh, param.placements)  # type: ignore[attr-defined]
    return local_tensor(grad.detach())


def full_tensor(param: torch.Tensor) -> torch.Tensor:
    """The logical tensor; a collective on the mesh when ``param`` is sharded."""
    return param.full_tensor() if isinstance(param, DTensor) else param


def shard_of(param: torch.Tensor) -> ShardCoords:
    """``(dim, offset, length)`` of this rank's slice in logical coordinates; None: whole.

    Every split follows ``torch.chunk`` (TP's ``Shard`` and FSDP2's both do): ``n`` rows
    over ``k`` ranks are ``ceil(n / k)`` each, the last ones fewer or none (length 0).
    Splits apply in placement order, except that FSDP's ``_StridedShard`` on "dp" splits
    the slice the later "tp" ``Shard`` of the same dimension made (FSDP2 shards the TP
    shard). Splits of two different dimensions are not one interval: a ValueError.
    """
    if not isinstance(param, DTensor):
        return None
    mesh = param.device_mesh
    for placement in param.placements:
        if not isinstance(placement, Shard | Replicate) and not _is_strided(placement):
            raise ValueError(f"parameter placement {placement} is neither Shard nor Replicate")
    splits = [
        (i, cast(Shard, placement).dim % param.dim(), _is_strided(placement))
        for i, placement in enumerate(param.placements)
        if not isinstance(placement, Replicate)
    ]
    if not splits:
        return None
    dims = {dim for _, dim, _ in splits}
    if len(dims) > 1:
        raise ValueError(
            f"a parameter split along dims {sorted(dims)} is not one interval of its logical "
            "tensor (shard data parallelism along the TP dimension)"
        )
    (dim,) = dims
    offset, length = 0, param.shape[dim]
    coords = mesh.get_coordinate() or [0] * mesh.ndim
    for mesh_dim, _, _ in sorted(splits, key=lambda s: s[2]):  # strided splits last
        size = -(-length // mesh.size(mesh_dim))
        start = min(coords[mesh_dim] * size, length)
        offset, length = offset + start, min(length, start + size) - start
    local_length = param.to_local().shape[dim]
    if local_length != length:
        raise ValueError(f"this rank holds {local_length} of dim {dim}, expected {length}")
    return dim, offset, length


def _is_strided(placement: Any) -> bool:
    """FSDP2's ``_StridedShard`` (a private class, a ``Shard`` only in some torch versions)."""
    return type(placement).__name__ == "_StridedShard"


def owns(param: torch.Tensor, site_rank: int, site_mesh: DeviceMesh | None = None) -> bool:
    """Whether this rank encodes ``param``'s slice. Of the ranks holding the same slice,
    the one at coordinate 0 along every dimension that does not split it: those where its
    placement is ``Replicate``, and the site mesh's dimensions its own mesh lacks (FSDP2
    puts a parameter TP left plain on the "dp" mesh alone). A plain tensor is the same on
    every rank: site rank 0 owns it."""
    if not isinstance(param, DTensor):
        return site_rank == 0
    mesh = param.device_mesh
    coords = mesh.get_coordinate() or [0] * mesh.ndim
    if any(coords[i] for i, p in enumerate(param.placements) if isinstance(p, Replicate)):
        return False
    if site_mesh is None:
        return True
    own_dims = set(mesh.mesh_dim_names or ())
    site_coords = site_mesh.get_coordinate() or [0] * site_mesh.ndim
    return not any(
        coord
        for name, coord in zip(site_mesh.mesh_dim_names or (), site_coords, strict=True)
        if name not in own_dims
    )


def narrow(full: torch.Tensor, shard: ShardCoords) -> torch.Tensor:
    """The slice ``shard`` of a logical tensor (a view)."""
    return full if shard is None else full.narrow(shard[0], shard[1], shard[2])


@dataclass(frozen=True, slots=True)
class Layout:
    """What the federation needs to know of a (maybe sharded) model on one rank: the
    logical spec of every tensor, this rank's slice of each and which slices it encodes."""

    spec: list[TensorInfo]
    """Names, logical shapes and dtypes, in the model's parameter order."""
    shards: list[ShardCoords]
    """This rank's slice of each tensor (None: it holds the whole tensor)."""
    owned: list[bool]
    """Whether this rank encodes that slice (one rank per distinct slice does)."""


def layout_of(
    params: Sequence[tuple[str, torch.Tensor]],
    site_rank: int,
    site_mesh: DeviceMesh | None = None,
    spec: list[TensorInfo] | None = None,
) -> Layout:
    """The :class:`Layout` of named parameters after any TP, FSDP2 or DDP on ``site_mesh``
    (None: one rank): each slice is read from its placements. ``spec``: the logical spec
    taken before sharding (default: from the parameters, whose shapes are logical for
    DTensors and plain tensors alike)."""
    tensors = [p for _, p in params]
    return Layout(
        spec=spec if spec is not None else model_spec(params),
        shards=[shard_of(p) for p in tensors],
        owned=[owns(p, site_rank, site_mesh) for p in tensors],
    )

"""A site's local ranks as processes: device choice, rendezvous, process groups, reaping.

Process structure for ``dp x tp = N > 1`` ranks (or any agent on CUDA):

    agent start            the supervisor: hosts the rendezvous store, starts N ranks,
    ├── rank 0             waits; when one rank dies it says why (once), stops the others
    │                      and exits with that rank's code
    │   the gRPC session, the round loop, logging; drives the others (``Site``)
    ├── rank 1 .. N-1      follow rank 0's steps; log errors only
    ...

Under ``srun`` or ``torchrun`` the launcher is the supervisor: it starts one ``agent start``
per rank, each reads its place from the environment (``skyfed.agent.placement``), and all
join through a store that rank 0 serves at the launcher's rendezvous address. From there
on the ranks run the same code as spawned ones (``skyfed.agent.launch.serve_rank``).

Ranks die with the supervisor (``PR_SET_PDEATHSIG``), so even ``kill -9`` of it leaves no
orphan. Each rank has two process groups: the default one (NCCL on CUDA, Gloo on CPU)
carries the mesh's collectives (TP, FSDP2/DDP); a Gloo group carries the control plane
(step names, compressed payload bytes) on the CPU, with a long timeout, since ranks 1..
legitimately wait there while rank 0 waits on the WAN.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from skyfed.agent import failure
from skyfed.agent.config import AgentConfig
from skyfed.agent.parallelize import build_mesh
from skyfed.agent.placement import Placement

log = logging.getLogger(__name__)

STORE_HOST = "127.0.0.1"
CONTROL_TIMEOUT = timedelta(days=1)
REAP_GRACE_S = 10.0
LEADER_GRACE_S = 5.0
"""After another rank failed, how long rank 0 may take to tell the coordinator and leave
by itself before the supervisor stops it."""
REASON_WAIT_S = 1.0
"""How long the supervisor waits for a failed rank's own reason to reach the store."""
PR_SET_PDEATHSIG = 1


def resolve_device(config: AgentConfig, placement: Placement | None = None) -> str:
    """``cpu`` or ``cuda`` for ``config.device``; ``cuda`` needs one GPU per rank (with a
    launcher: a GPU for this rank's local rank, see :func:`gpu_index`)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ranks = config.ranks
    enough = gpus >= ranks if placement is None else gpu_index(placement, gpus) is not None
    if config.device == "auto":
        return "cuda" if enough else "cpu"
    if config.device == "cuda" and not enough:
        need = f"{ranks} ranks" if placement is None else f"local rank {placement.local_rank}:"
        raise ValueError(f"agent option device='cuda' needs a GPU per rank ({need}), found {gpus}")
    return config.device


def gpu_index(placement: Placement, gpus: int) -> int | None:
    """The GPU a launched rank takes: its local rank, or the only one it sees (a launcher
    that binds one GPU per task, ``srun --gpus-per-task=1``); None: no GPU for it."""
    if gpus > placement.local_rank:
        return placement.local_rank
    return 0 if gpus == 1 else None


def placed_config(config: AgentConfig, placement: Placement) -> AgentConfig:
    """``config`` with its layout set to the launcher's tasks: ``dp x tp`` must be the
    world size; ``dp`` left at 0 is what ``tp`` leaves of it (a manifest or script that
    says otherwise is wrong: refused, not bent)."""
    world, who = placement.world, f"{placement.launcher}'s {placement.world} tasks"
    if config.dp == 0:
        if world % config.tp:
            raise ValueError(f"agent option tp={config.tp} does not divide {who}")
        config = dataclasses.replace(config, dp=world // config.tp)
    if config.dp * config.tp != world:
        raise ValueError(
            f"agent options dp={config.dp} x tp={config.tp} = {config.dp * config.tp} "
            f"ranks disagree with {who} (leave dp unset or make them equal)"
        )
    return shard_groups(config, placement.local_world // config.tp)


def spawned_config(config: AgentConfig) -> AgentConfig:
    """``config`` for a site whose ranks ``agent start`` spawns: ``dp`` 0 is 1, and all
    replicas on this host are one HSDP shard group."""
    config = dataclasses.replace(config, dp=max(1, config.dp))
    return shard_groups(config, config.dp)


def shard_groups(config: AgentConfig, node_replicas: int) -> AgentConfig:
    """``config`` with HSDP's ``dp_shard`` settled: 0 is the replicas on one node (all of
    them where the launcher does not say); it must divide ``dp``."""
    if config.dp_mode != "hsdp":
        return config
    shard = config.dp_shard or node_replicas or config.dp
    if config.dp % shard:
        raise ValueError(
            f"agent option dp_shard={shard} does not divide dp={config.dp} (HSDP's shard "
            "groups split the replicas evenly)"
        )
    return dataclasses.replace(config, dp_shard=shard)


def needs_ranks(config: AgentConfig) -> bool:
    """One in-process rank for a 1 x 1 site on CPU; rank processes for more, or for CUDA."""
    return config.ranks > 1 or resolve_device(config) == "cuda"


class Ranks:
    """The control group of a multi-rank site (see ``skyfed.agent.site.RankGroup``), and
    the rendezvous store the ranks leave their failure reasons in (``failure``)."""

    def __init__(self, group: dist.ProcessGroup, store: dist.Store | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.store = store

    def broadcast(self, obj: Any) -> Any:
        if self.world == 1:  # nothing to send: and no pickling (payloads are memoryviews)
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` on rank 0, in rank order (pickled across ranks; a group of
        one, a CUDA site's single rank, hands its own back as it is)."""
        if self.world == 1:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.group)
        return out or []


@dataclass(frozen=True, slots=True)
class RankSpec:
    """What one rank process needs to join its site."""

    config: AgentConfig
    rank: int
    device_type: str
    store_port: int
    parent_pid: int
    log_level: str | None


def init_ranks(
    rank: int,
    world: int,
    device_type: str,
    store: dist.Store,
    *,
    dp: int = 1,
    dp_shard: int = 0,
    gpu: int | None = None,
    single_host: bool = True,
) -> tuple[Ranks, DeviceMesh, torch.device]:
    """Join the site's process groups; returns the control group, the mesh of ``dp``
    replicas of ``world / dp`` TP ranks (HSDP's shard groups of ``dp_shard`` replicas, if
    given: ``skyfed.agent.parallelize.build_mesh``), and the device.

    ``gpu``: the CUDA device index (default: ``rank``, as when this host spawned every rank).
    """
    if sys.platform == "linux" and single_host:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this host
    if device_type == "cuda":
        device = torch.device("cuda", rank if gpu is None else gpu)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return Ranks(control, store), build_mesh(device_type, dp, world // dp, dp_shard), device


def open_store(placement: Placement) -> dist.TCPStore:
    """The launcher's rendezvous: rank 0 serves the store (unless the launcher does), the
    others connect to it."""
    return dist.TCPStore(
        placement.master_addr,
        placement.master_port,
        placement.world,
        is_master=placement.rank == 0 and not placement.store_is_served,
        wait_for_workers=False,
    )


def start_ranks(
    config: AgentConfig, device_type: str, log_level: str | None
) -> tuple[dist.TCPStore, list[BaseProcess]]:
    """Host the rendezvous store (port 0: no race for a port) and start ``dp x tp`` ranks."""
    from skyfed.agent.launch import rank_main  # the ranks' entry point

    store = dist.TCPStore(STORE_HOST, 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    procs: list[BaseProcess] = []
    for rank in range(config.ranks):
        spec = RankSpec(config, rank, device_type, store.port, os.getpid(), log_level)
        procs.append(ctx.Process(target=rank_main, args=(spec,), name=f"rank{rank}"))
        procs[-1].start()
    return store, procs


def supervise(procs: list[BaseProcess], store: dist.Store, config: AgentConfig) -> int:
    """Wait until rank 0 ends (its exit code) or another rank fails; then say why once
    (``failure``), keep the reason in the state directory, give rank 0 a moment to tell
    the coordinator, and return the failed rank's exit code."""
    lead = procs[0]
    while True:
        running = [p for p in procs if p.exitcode is None]
        if lead not in running:
            break
        failed = [p for p in procs[1:] if p.exitcode not in (None, 0)]
        if failed:
            return _site_down(procs, failed[0], store, config)
        wait([p.sentinel for p in running])
    for p in procs[1:]:
        p.join(REAP_GRACE_S)
    if lead.exitcode not in (0, failure.EXIT_SITE_DOWN, *QUIET_CODES):
        reason = failure.reported(store, len(procs)) or (
            f"{failure.where(0, config.ranks // config.tp, config.tp)} "
            f"{failure.exit_reason(lead.exitcode or 0)}"
        )
        failure.keep(config.state_dir, failure.announce(store, reason))
    return exit_code(lead)


QUIET_CODES = (2, 3, 4)
"""Rank 0's own ends that it has already explained (usage, refused, no session)."""


def _site_down(procs: list[BaseProcess], failed: BaseProcess, store: dist.Store, config) -> int:
    """A rank other than 0 failed: the site's reason, said once; rank 0 leaves by itself
    (telling the coordinator) within ``LEADER_GRACE_S``, or is stopped."""
    rank = procs.index(failed)
    deadline = time.monotonic() + REASON_WAIT_S
    reason = failure.reported(store, len(procs))
    while reason is None and time.monotonic() < deadline:
        time.sleep(0.05)
        reason = failure.reported(store, len(procs))
    if reason is None:
        where = failure.where(rank, config.ranks // config.tp, config.tp)
        reason = f"{where} {failure.exit_reason(failed.exitcode or 0)}"
    failure.keep(config.state_dir, failure.announce(store, reason))
    procs[0].join(LEADER_GRACE_S)
    return exit_code(failed)


def reap(procs: list[BaseProcess]) -> None:
    """SIGTERM every rank still running, SIGKILL those that outlive the grace period."""
    for p in procs:
        if p.exitcode is None:
            p.terminate()
    for p in procs:
        p.join(REAP_GRACE_S)
        if p.exitcode is None:
            p.kill()
            p.join()


def exit_code(proc: BaseProcess) -> int:
    """A shell's view of a process's end: its code, or 128 + the signal that killed it."""
    code = proc.exitcode or 0
    return 128 - code if code < 0 else code


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL us when the supervisor dies; exit now if it already has."""
    if sys.platform == "linux":
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)

"""A rank's place in its site when a launcher (``srun``, ``torchrun``) started the ranks.

``agent start`` normally spawns its own ``tp`` rank processes (``skyfed.agent.ranks``).
Under Slurm or torchrun the launcher has already started one process per rank, so each
``agent start`` reads which rank it is from the launcher's environment instead and joins
the same rendezvous and process groups (see ``docs/deployment.md``):

    launcher   rank            world             local rank       rendezvous host
    slurm      SLURM_PROCID    SLURM_NTASKS      SLURM_LOCALID    first host of the step's
                                                                  node list
    torchrun   RANK            WORLD_SIZE        LOCAL_RANK       MASTER_ADDR

``MASTER_ADDR`` and ``MASTER_PORT`` override the host and port under Slurm too; without
``MASTER_PORT`` a Slurm step derives the port from its job id, so two jobs sharing a node
do not collide.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

Launcher = Literal["auto", "spawn", "slurm", "torchrun"]
"""Who starts a site's ranks (``agent start --launcher``)."""
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
SLURM_PORT_BASE = 29500
SLURM_PORT_SPAN = 10000  # ports SLURM_PORT_BASE .. +SPAN-1, by job id


@dataclass(frozen=True, slots=True)
class Placement:
    """One rank of a site whose ranks a launcher started, as that launcher describes it."""

    launcher: str
    """``slurm`` or ``torchrun``: who told us."""
    rank: int
    """This process's rank in the site, 0 .. world-1; rank 0 holds the coordinator session."""
    world: int
    """How many ranks the site has: its tensor-parallel degree."""
    local_rank: int
    """This process's rank on its host: which GPU it takes."""
    master_addr: str
    """Host of the rendezvous store, which rank 0 serves."""
    master_port: int
    """TCP port of the rendezvous store."""
    single_host: bool
    """Every rank on one host (then Gloo stays on loopback)."""
    store_is_served: bool = False
    """The launcher already serves the store at the rendezvous address (torchrun's agent
    does, ``TORCHELASTIC_USE_AGENT_STORE``); else rank 0 serves it."""
    local_world: int = 0
    """The site's ranks on this host (0: the launcher does not say): HSDP's shard group."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"{self.launcher}: rank {self.rank} is not in 0..{self.world - 1}")
        if not 0 <= self.local_rank <= self.rank:
            raise ValueError(f"{self.launcher}: local rank {self.local_rank} is not in 0..rank")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"{self.launcher}: rendezvous port {self.master_port} is not 1..65535")
        if not self.master_addr:
            raise ValueError(f"{self.launcher}: no rendezvous host")


def detect(launcher: str, env: Mapping[str, str]) -> Placement | None:
    """This process's placement, or None when the agent spawns its own ranks.

    ``auto`` picks Slurm inside an ``srun`` step (``SLURM_STEP_ID`` is set there, not in
    the batch script itself, whose ``SLURM_NTASKS`` counts the job's tasks), then torchrun
    when ``RANK`` and ``WORLD_SIZE`` are set, else ``spawn``. Naming a launcher whose
    variables are missing is an error, not a silent fallback to one rank.
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"agent option launcher={launcher!r} must be one of {LAUNCHERS}")
    if launcher == "auto":
        if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env:
            launcher = "slurm"
        elif "RANK" in env and "WORLD_SIZE" in env:
            launcher = "torchrun"
        else:
            return None
    if launcher == "spawn":
        return None
    return _slurm(env) if launcher == "slurm" else _torchrun(env)


def _slurm(env: Mapping[str, str]) -> Placement:
    if "SLURM_STEP_ID" not in env:
        # The batch script itself: its SLURM_NTASKS counts tasks that srun has not started.
        raise ValueError("launcher slurm: not inside an srun step (run `srun agent start ...`)")
    rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
    local_rank = _int(env, "SLURM_LOCALID")
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    host = env.get("MASTER_ADDR") or (first_host(nodes) if nodes else "")
    num_nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    if "MASTER_PORT" in env:
        port = _int(env, "MASTER_PORT")
    else:
        port = SLURM_PORT_BASE + _int(env, "SLURM_JOB_ID") % SLURM_PORT_SPAN
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    return Placement(
        launcher="slurm",
        rank=rank,
        world=world,
        local_rank=local_rank,
        master_addr=host,
        master_port=port,
        single_host=num_nodes.strip() == "1",
        local_world=_leading_int(per_node),
    )


def _torchrun(env: Mapping[str, str]) -> Placement:
    world = _int(env, "WORLD_SIZE")
    local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
    return Placement(
        launcher="torchrun",
        rank=_int(env, "RANK"),
        world=world,
        local_rank=_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else _int(env, "RANK"),
        master_addr=env.get("MASTER_ADDR", ""),
        master_port=_int(env, "MASTER_PORT"),
        single_host=local_world == world,
        store_is_served=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        local_world=local_world,
    )


def _leading_int(text: str) -> int:
    """Slurm's tasks per node, ``8(x2)`` or ``8,4``: the first node's (0: none said)."""
    digits = re.match(r"\s*(\d+)", text)
    return int(digits.group(1)) if digits else 0


def _int(env: Mapping[str, str], name: str) -> int:
    if name not in env:
        raise ValueError(f"{name} is not set (the launcher should set it)")
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"{name}={env[name]!r} is not an integer") from None


_BRACKET = re.compile(r"\[([^\]]*)\]")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: ``gpu[07-09,12],cpu1`` -> ``gpu07``.

    What ``scontrol show hostnames`` prints first, without needing ``scontrol`` on the
    compute node: each bracket takes the first item of its first range (zero padding
    kept), so ``rack[2-3]-n[001-004]`` -> ``rack2-n001``.
    """
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            end = i
            break
    head = nodelist[:end].strip()
    if not head or depth < 0 or head.count("[") != head.count("]"):
        raise ValueError(f"cannot read a host from the Slurm node list {nodelist!r}")
    return _BRACKET.sub(lambda m: re.split(r"[,-]", m.group(1))[0], head)

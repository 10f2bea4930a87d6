"""Starting an agent: one in-process rank, a supervisor and ``tp`` rank processes, or
one rank of a site whose ranks ``srun`` or ``torchrun`` started."""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import signal
import sys
import zlib
from typing import NoReturn

import click
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from skyfed.agent.config import AgentConfig
from skyfed.agent.placement import Placement, detect
from skyfed.agent.ranks import (
    STORE_HOST,
    RankSpec,
    die_with_parent,
    gpu_index,
    init_ranks,
    needs_ranks,
    open_store,
    placed_config,
    reap,
    resolve_device,
    start_ranks,
    supervise,
)
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalTrainer
from skyfed.allocator import fix_mmap_threshold
from skyfed.logs import setup_logging
from skyfed.tasks import load_task

log = logging.getLogger(__name__)

EXIT_REFUSED = 3
EXIT_NO_SESSION = 4
EXIT_TERMINATED = 128 + signal.SIGTERM
"""SIGTERM before the federation finished (a node drain, a spot loss): a failure to the
supervisor, never a success that completes a Kubernetes Job (docs/operations.md)."""


def exit_on_sigterm(code: int = EXIT_TERMINATED) -> None:
    """On SIGTERM, exit with ``code``; the exit unwinds, so streams close and ranks are reaped."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(code))


# Set by ``agent start`` so rank 0 of a tp > 1 site prints its rounds too.
PROGRESS_ENV = "SKYFED_AGENT_PROGRESS"


def settle(config: AgentConfig) -> tuple[AgentConfig, Placement | None]:
    """The configuration this process runs and, under a launcher, its placement; raises
    ValueError for what ``agent start`` reports as a usage error (wrong tp, no GPU)."""
    placement = detect(config.launcher, os.environ)
    if placement is not None:
        config = placed_config(config, placement)
    resolve_device(config, placement)
    return config, placement


def run(config: AgentConfig, log_level: str | None = None, progress: bool = False) -> int:
    """Train until the federation is done; the exit code for ``agent start``. ``progress``:
    a line per applied round on stderr."""
    fix_mmap_threshold()
    config, placement = settle(config)
    if placement is not None:
        return run_placed(config, placement, log_level)
    if not needs_ranks(config):
        torch.set_num_threads(config.threads)
        return lead(config, Site(_trainer(config), sender=config.name), progress)
    device_type = resolve_device(config)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    store, procs = start_ranks(config, device_type, log_level)
    log.info(
        "[Agent.Ranks] tp=%d device=%s pids=%s",
        config.tp,
        device_type,
        ",".join(str(p.pid) for p in procs),
    )
    try:
        return supervise(procs)
    finally:
        reap(procs)
        del store


def lead(config: AgentConfig, site: Site, progress: bool = False) -> int:
    """Rank 0: run the session loop over ``site``; map final refusals to exit codes."""
    from skyfed.agent.daemon import Agent
    from skyfed.agent.link import LinkClosed
    from skyfed.agent.observe import RoundLines, start_metrics

    # Everything built so far (torch, the model, gRPC) lives as long as the process: out of
    # the cyclic collector's sight, whose full passes over it took ~20 % of an agent's CPU
    # at 25M parameters (docs/scale.md); per-chunk garbage is still collected.
    gc.freeze()
    agent = Agent(config, site)
    metrics = start_metrics(agent, config)
    lines = RoundLines(agent, config, lambda line: click.echo(line, err=True))
    if progress:
        lines.start()
    try:
        agent.run()
        exit_on_sigterm(0)  # finished: a SIGTERM from here on ends a finished site
    except LinkClosed as exc:
        click.echo(f"agent {config.name}: refused by the coordinator: {exc}", err=True)
        return EXIT_REFUSED
    except TimeoutError as exc:
        click.echo(f"agent {config.name}: {exc}", err=True)
        return EXIT_NO_SESSION
    finally:
        if progress:
            lines.close()
        if metrics is not None:
            metrics.close()
    site.stop()
    return 0


def rank_main(spec: RankSpec) -> None:
    """Entry point of one rank process (spawned by :func:`skyfed.agent.ranks.start_ranks`)."""
    die_with_parent(spec.parent_pid)
    fix_mmap_threshold()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: where is it stuck?
    who = spec.config.name if spec.rank == 0 else f"{spec.config.name}/rank{spec.rank}"
    setup_logging(spec.log_level if spec.rank == 0 else "ERROR", who=who)
    store = dist.TCPStore(STORE_HOST, spec.store_port, is_master=False)
    exit_rank(serve_rank(spec.config, spec.rank, spec.device_type, store))


def exit_rank(code: int) -> NoReturn:
    """End a rank process whose site has stopped and whose process groups are destroyed.

    Its supervisor (``agent start``, srun, torchrun) judges it by its exit code alone, and
    interpreter teardown from here sometimes aborts in torch's C++ destructors ("terminate
    called without an active exception", SIGABRT: about one tp=2 run in four with torch
    2.13, either rank), which would fail a finished site. So flush and leave at once.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_placed(config: AgentConfig, placement: Placement, log_level: str | None) -> NoReturn:
    """One rank of a launched site: the launcher (srun, torchrun) supervises, not us.

    Only rank 0 logs above ERROR, as with spawned ranks (``agent start`` set up logging
    before it knew the rank, so the level is lowered here)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if placement.rank > 0:
        logging.getLogger().setLevel(logging.ERROR)
    device_type = resolve_device(config, placement)
    log.info(
        "[Agent.Ranks] %s rank=%d/%d local=%d device=%s rendezvous=%s:%d",
        placement.launcher,
        placement.rank,
        placement.world,
        placement.local_rank,
        device_type,
        placement.master_addr,
        placement.master_port,
    )
    store = open_store(placement)
    gpus = torch.cuda.device_count() if device_type == "cuda" else 0
    code = serve_rank(
        config,
        placement.rank,
        device_type,
        store,
        gpu=gpu_index(placement, gpus) if device_type == "cuda" else None,
        single_host=placement.single_host,
    )
    exit_rank(code)


def serve_rank(
    config: AgentConfig,
    rank: int,
    device_type: str,
    store: dist.Store,
    *,
    gpu: int | None = None,
    single_host: bool = True,
) -> int:
    """Any rank of a multi-rank site, however started: join, then lead (rank 0) or follow."""
    torch.set_num_threads(config.threads)
    group, mesh, device = init_ranks(
        rank, config.tp, device_type, store, gpu=gpu, single_host=single_host
    )
    site = Site(_trainer(config, mesh=mesh, device=device), group, sender=config.name)
    if rank == 0:
        exit_on_sigterm()
        code = lead(config, site, progress=os.environ.get(PROGRESS_ENV) == "1")
    else:
        site.follow()
        code = 0
    dist.destroy_process_group()
    return code


def _trainer(
    config: AgentConfig, mesh: DeviceMesh | None = None, device: torch.device | None = None
) -> LocalTrainer:
    return LocalTrainer(
        load_task(config.task),
        seed=config.seed,
        shard=config.shard,
        num_shards=config.num_shards,
        local_steps=config.local_steps,
        mesh=mesh,
        device=device,
        data_seed=data_seed(config.seed, config.name, config.num_shards),
    )


def data_seed(seed: int, name: str, num_shards: int) -> int | None:
    """With one shard (the default) each site draws its own windows of the whole data,
    seeded by ``seed`` and its name: sites started from the same recipe no longer train
    on identical batches. With ``num_shards > 1`` the shards keep them apart."""
    if num_shards > 1:
        return None
    return seed * 1000 + zlib.crc32(name.encode()) % 1_000_000 + 1

"""Starting an agent: one in-process rank, or a supervisor and ``tp`` rank processes."""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import zlib

import click
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from skyfed.agent.config import AgentConfig
from skyfed.agent.ranks import (
    STORE_HOST,
    RankSpec,
    die_with_parent,
    init_ranks,
    needs_ranks,
    reap,
    resolve_device,
    start_ranks,
    supervise,
)
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalTrainer
from skyfed.logs import setup_logging
from skyfed.tasks import load_task

log = logging.getLogger(__name__)

EXIT_REFUSED = 3
EXIT_NO_SESSION = 4


def run(config: AgentConfig, log_level: str | None = None) -> int:
    """Train until the federation is done; the exit code for ``agent start``."""
    if not needs_ranks(config):
        torch.set_num_threads(config.threads)
        return lead(config, Site(_trainer(config), sender=config.name))
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


def lead(config: AgentConfig, site: Site) -> int:
    """Rank 0: run the session loop over ``site``; map final refusals to exit codes."""
    from skyfed.agent.daemon import Agent
    from skyfed.agent.link import LinkClosed

    try:
        Agent(config, site).run()
    except LinkClosed as exc:
        click.echo(f"agent {config.name}: refused by the coordinator: {exc}", err=True)
        return EXIT_REFUSED
    except TimeoutError as exc:
        click.echo(f"agent {config.name}: {exc}", err=True)
        return EXIT_NO_SESSION
    site.stop()
    return 0


def rank_main(spec: RankSpec) -> None:
    """Entry point of one rank process (spawned by :func:`skyfed.agent.ranks.start_ranks`)."""
    die_with_parent(spec.parent_pid)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: where is it stuck?
    config, rank = spec.config, spec.rank
    who = config.name if rank == 0 else f"{config.name}/rank{rank}"
    setup_logging(spec.log_level if rank == 0 else "ERROR", who=who)
    torch.set_num_threads(config.threads)
    store = dist.TCPStore(STORE_HOST, spec.store_port, is_master=False)
    group, mesh, device = init_ranks(rank, config.tp, spec.device_type, store)
    site = Site(_trainer(config, mesh=mesh, device=device), group, sender=config.name)
    if rank == 0:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds: the stream closes
        code = lead(config, site)
    else:
        site.follow()
        code = 0
    dist.destroy_process_group()
    sys.exit(code)


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
        data_seed=data_seed(config),
    )


def data_seed(config: AgentConfig) -> int | None:
    """With one shard (the default) each site draws its own windows of the whole data,
    seeded by ``seed`` and its name: sites started from the same recipe no longer train
    on identical batches. With ``num_shards > 1`` the shards keep them apart."""
    if config.num_shards > 1:
        return None
    return config.seed * 1000 + zlib.crc32(config.name.encode()) % 1_000_000 + 1

"""Starting an agent: one in-process rank, a supervisor and ``dp x tp`` rank processes,
or one rank of a site whose ranks ``srun`` or ``torchrun`` started."""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import signal
import sys
import threading
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import click
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from skyfed.agent import failure
from skyfed.agent.config import AgentConfig
from skyfed.agent.placement import Placement, detect
from skyfed.agent.ranks import (
    STORE_HOST,
    Ranks,
    RankSpec,
    die_with_parent,
    gpu_index,
    init_ranks,
    needs_ranks,
    open_store,
    placed_config,
    reap,
    resolve_device,
    spawned_config,
    start_ranks,
    supervise,
)
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalTrainer
from skyfed.allocator import fix_mmap_threshold
from skyfed.logs import setup_logging
from skyfed.procs import exit_rank
from skyfed.tasks import load_task

if TYPE_CHECKING:
    from skyfed.agent.daemon import Agent

log = logging.getLogger(__name__)

EXIT_REFUSED = 3
EXIT_NO_SESSION = 4
EXIT_SITE_DOWN = failure.EXIT_SITE_DOWN
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
    config = spawned_config(config) if placement is None else placed_config(config, placement)
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
        return lead(config, _site(config, _trainer(config)), progress)
    device_type = resolve_device(config)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    store, procs = start_ranks(config, device_type, log_level)
    log.info(
        "[Agent.Ranks] dp=%d tp=%d device=%s pids=%s",
        config.dp,
        config.tp,
        device_type,
        ",".join(str(p.pid) for p in procs),
    )
    try:
        return supervise(procs, store, config)
    finally:
        reap(procs)
        del store


def lead(config: AgentConfig, site: Site, progress: bool = False) -> int:
    """Rank 0: run the session loop over ``site``; map final refusals to exit codes."""
    from skyfed.agent.daemon import Agent, SiteDown
    from skyfed.agent.link import LinkClosed

    # Everything built so far (torch, the model, gRPC) lives as long as the process: out of
    # the cyclic collector's sight, whose full passes over it took ~20 % of an agent's CPU
    # at 25M parameters (docs/scale.md); per-chunk garbage is still collected.
    gc.freeze()
    agent = Agent(config, site)
    say = (lambda line: click.echo(line, err=True)) if progress else None
    try:
        serve_session(agent, say)
        exit_on_sigterm(0)  # finished: a SIGTERM from here on ends a finished site
    except LinkClosed as exc:
        click.echo(f"agent {config.name}: refused by the coordinator: {exc}", err=True)
        return EXIT_REFUSED
    except TimeoutError as exc:
        click.echo(f"agent {config.name}: {exc}", err=True)
        return EXIT_NO_SESSION
    except SiteDown:
        return EXIT_SITE_DOWN
    site.stop()
    return 0


def serve_session(agent: Agent, say: Callable[[str], None] | None = None) -> None:
    """Rank 0 of any site (``agent start``'s, a script's ``skyfed.Site``): its residuals
    restored, the session loop until the federation is done, beside it the metrics port
    (if configured) and, with ``say``, a line per applied round. Raises what ends the
    loop otherwise (``Agent.run``)."""
    from skyfed.agent.observe import RoundLines, start_metrics

    metrics = start_metrics(agent, agent.config)
    lines = RoundLines(agent, agent.config, say) if say is not None else None
    if lines is not None:
        lines.start()
    try:
        agent.site.restore()
        agent.run()
    finally:
        if lines is not None:
            lines.close()
        if metrics is not None:
            metrics.close()


def rank_main(spec: RankSpec) -> None:
    """Entry point of one rank process (spawned by :func:`skyfed.agent.ranks.start_ranks`)."""
    die_with_parent(spec.parent_pid)
    fix_mmap_threshold()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: where is it stuck?
    who = spec.config.name if spec.rank == 0 else f"{spec.config.name}/rank{spec.rank}"
    setup_logging(spec.log_level if spec.rank == 0 else "ERROR", who=who)
    store = dist.TCPStore(STORE_HOST, spec.store_port, is_master=False)
    exit_rank(serve_rank(spec.config, spec.rank, spec.device_type, store))


def run_placed(config: AgentConfig, placement: Placement, log_level: str | None) -> NoReturn:
    """One rank of a launched site: the launcher (srun, torchrun) supervises, not us.

    Only rank 0 logs above ERROR, as with spawned ranks (``agent start`` set up logging
    before it knew the rank, so the level is lowered here)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if placement.rank > 0:
        logging.getLogger().setLevel(logging.ERROR)
    device_type = resolve_device(config, placement)
    log.info(
        "[Agent.Ranks] %s rank=%d/%d local=%d device=%s rendezvous=%s:%d dp=%d tp=%d "
        "cuda_visible=%s cpus=%s",
        placement.launcher,
        placement.rank,
        placement.world,
        placement.local_rank,
        device_type,
        placement.master_addr,
        placement.master_port,
        config.dp,
        config.tp,
        os.environ.get("CUDA_VISIBLE_DEVICES", "-"),
        cpu_list(),
    )
    joined = threading.Event()
    probes = None
    if placement.rank > 0 and placement.local_rank == 0:  # another node's first rank
        from skyfed.agent.observe import start_node_probes

        probes = start_node_probes(config, joined.is_set)
    store = open_store(placement)
    gpus = torch.cuda.device_count() if device_type == "cuda" else 0
    code = serve_rank(
        config,
        placement.rank,
        device_type,
        store,
        gpu=gpu_index(placement, gpus) if device_type == "cuda" else None,
        single_host=placement.single_host,
        joined=joined,
    )
    if probes is not None:
        probes.close()
    exit_rank(code)


def cpu_list() -> str:
    """The CPUs this process may run on, as ranges (``0-3,8``): what a launcher bound it to."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    spans: list[str] = []
    for cpu in cpus:
        if spans and int(spans[-1].split("-")[-1]) == cpu - 1:
            spans[-1] = f"{spans[-1].split('-')[0]}-{cpu}"
        else:
            spans.append(str(cpu))
    return ",".join(spans) or "-"


def serve_rank(
    config: AgentConfig,
    rank: int,
    device_type: str,
    store: dist.Store,
    *,
    gpu: int | None = None,
    single_host: bool = True,
    joined: threading.Event | None = None,
) -> int:
    """Any rank of a multi-rank site, however started: join, then lead (rank 0) or follow
    (``joined`` is set once the ranks have joined the site's groups).

    A rank that fails on its own leaves its one-line reason in the store and says it (the
    traceback only at DEBUG); one that fails because another rank is gone exits quietly
    with ``EXIT_SITE_DOWN`` (``skyfed.agent.failure``)."""
    torch.set_num_threads(config.threads)
    if rank == 0:
        exit_on_sigterm()  # unwinds: the stream closes
    try:
        group, mesh, device = init_ranks(
            rank,
            config.ranks,
            device_type,
            store,
            dp=config.dp,
            dp_shard=config.dp_shard if config.dp_mode == "hsdp" else 0,
            gpu=gpu,
            single_host=single_host,
        )
        site = _site(config, _trainer(config, mesh=mesh, device=device), group)
        if joined is not None:
            joined.set()
        if rank == 0:
            code = lead(config, site, progress=os.environ.get(PROGRESS_ENV) == "1")
        else:
            site.follow()
            code = 0
    except SystemExit as exc:  # SIGTERM: the supervisor or the launcher stops the site
        return exc.code if isinstance(exc.code, int) else 0
    except BaseException as exc:
        return failed_rank(exc, rank, store, config)
    dist.destroy_process_group()
    return code


def failed_rank(exc: BaseException, rank: int, store: dist.Store, config: AgentConfig) -> int:
    """A rank's end by an exception: its reason in the store and the log (once), or, for a
    lost peer, nothing of its own (the rank that failed first says why)."""
    if failure.lost_peer(exc):
        log.debug("[Agent.Ranks] rank %d lost a peer", rank, exc_info=exc)
        return EXIT_SITE_DOWN
    reason = f"{failure.where(rank, config.dp, config.tp)}: {failure.one_line(exc)}"
    log.debug("[Agent.Ranks] rank %d failed", rank, exc_info=exc)
    failure.report(store, rank, reason)
    failure.announce(store, reason)
    failure.keep(config.state_dir if rank == 0 else None, reason)
    return 1


def _site(config: AgentConfig, trainer: LocalTrainer, group: Ranks | None = None) -> Site:
    return Site(
        trainer,
        group,
        sender=config.name,
        state_dir=config.state_dir,
        gpu_every_steps=config.gpu_every_steps,
        gpu_warn_c=config.gpu_warn_c,
    )


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
        dp_mode=config.dp_mode,
    )


def data_seed(seed: int, name: str, num_shards: int) -> int | None:
    """With one shard (the default) each site draws its own windows of the whole data,
    seeded by ``seed`` and its name: sites started from the same recipe no longer train
    on identical batches. With ``num_shards > 1`` the shards keep them apart."""
    if num_shards > 1:
        return None
    return seed * 1000 + zlib.crc32(name.encode()) % 1_000_000 + 1

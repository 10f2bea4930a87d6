"""``agent start``."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from skyfed.agent.config import DP_MODES, AgentConfig
from skyfed.agent.placement import LAUNCHERS
from skyfed.cliflags import field_flags, log_options, metrics_options, show_defaults
from skyfed.config import load_config
from skyfed.logs import setup_logging


@click.group()
def main() -> None:
    """The skyfed agent: local training and the link to the coordinator."""


@main.command()
@click.option(
    "--config", "config_path", type=click.Path(exists=True, path_type=Path), help="TOML file."
)
@click.option("--cloud", help="This site's cloud (aws, gcp, azure, ...).")
@click.option("--name", help="Agent name (default <cloud>-1).")
@click.option(
    "--coordinator", help="Coordinator HOST:PORT; replicas: HOST:PORT,HOST:PORT,... (failover.md)."
)
@click.option(
    "--certs", type=click.Path(path_type=Path), help="certs directory (ca.crt, <name>.crt/.key)."
)
@click.option("--ca", type=click.Path(path_type=Path))
@click.option("--cert", type=click.Path(path_type=Path))
@click.option("--key", type=click.Path(path_type=Path))
@click.option("--server-name", help="TLS name on the coordinator's certificate.")
@click.option("--task")
@click.option("--shard", type=int)
@click.option("--num-shards", type=int)
@click.option("--local-steps", type=int)
@click.option("--rounds", type=int, help="Stop after this many rounds (0: until final).")
@click.option(
    "--dp", type=int, help="Data-parallel replicas of the site (0: the launcher's tasks over tp)."
)
@click.option("--tp", type=int, help="Tensor-parallel ranks (processes) of each replica.")
@click.option(
    "--dp-mode",
    type=click.Choice(DP_MODES),
    help="How replicas keep one model: fsdp (FSDP2), hsdp (FSDP2 in a node, replicated "
    "across), ddp, or auto (DDP while it fits).",
)
@click.option("--dp-shard", type=int, help="hsdp: replicas per shard group (0: a node's).")
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    help="Keep the site's residuals and last error here across restarts.",
)
@click.option(
    "--max-streams", type=int, help="Most TCP connections to stripe the session over (1: one)."
)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), help="Where the ranks train.")
@click.option(
    "--launcher",
    type=click.Choice(LAUNCHERS),
    help="Who starts the ranks: this command (spawn), srun, torchrun; default auto: "
    "the environment tells.",
)
@click.option("--reconnect-initial-s", type=float, help="First reconnect delay (default 0.2).")
@click.option("--reconnect-max-s", type=float, help="Longest reconnect delay (default 5).")
@click.option(
    "--give-up-after-s", type=float, help="Exit after this long without a session (default 600)."
)
@click.option(
    "--report", type=click.Path(path_type=Path), help="JSON report, rewritten each round."
)
@metrics_options
@click.option("--no-progress", is_flag=True, help="No line per applied round.")
@log_options
@field_flags(
    AgentConfig,
    {
        "seed": (int, "Seed of the initial weights (the coordinator's) and the data order."),
        "threads": (int, "torch intra-op threads for local training."),
        "gpu_every_steps": (int, "Read each rank's GPU (NVML) every this many steps (0: never)."),
        "gpu_warn_c": (float, "Warn when a GPU's temperature passes this (degrees C)."),
    },
)
def start(
    config_path: Path | None,
    log_level: str | None,
    log_format: str | None,
    no_progress: bool,
    **flags: object,
) -> None:
    """Join the federation and train until it is done."""
    try:
        config = load_config(AgentConfig, component="agent", path=config_path, flags=flags)
        from skyfed.agent.launch import settle

        # Fails early: cuda without enough GPUs, dp x tp against the launcher.
        placed, placement = settle(config)
        from skyfed.agent import preflight

        preflight.check(placed)  # key pair, files, task, TP plan: one line each
    except (ValueError, TypeError, OSError) as exc:
        raise click.UsageError(str(exc)) from exc
    if log_format:
        os.environ["SKYFED_LOG_FORMAT"] = log_format  # the rank processes log alike
    setup_logging(log_level, who=config.name, fmt=log_format)
    if placement is not None and placement.rank > 0:
        logging.getLogger().setLevel(logging.ERROR)  # only the site's rank 0 logs more
    from skyfed.agent.launch import PROGRESS_ENV, exit_on_sigterm, run
    from skyfed.netinfo import log_congestion_control, target_host

    log_congestion_control(target_host(config.coordinators[0]), "agent")

    progress = not no_progress and log_format != "json"
    os.environ[PROGRESS_ENV] = "1" if progress else "0"
    exit_on_sigterm()  # non-zero unless the federation finished
    sys.exit(run(config, log_level, progress))


show_defaults(start, AgentConfig)

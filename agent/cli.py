"""``agent start``."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from skyfed.agent.config import AgentConfig
from skyfed.config.flags import config_options, log_options
from skyfed.config.load import load_config
from skyfed.logs import setup_logging


@click.group()
def main() -> None:
    """The skyfed agent: local training and the link to the coordinator."""


@main.command()
@click.option(
    "--config", "config_path", type=click.Path(exists=True, path_type=Path), help="TOML file."
)
@config_options(AgentConfig)
@click.option("--no-progress", is_flag=True, help="No line per applied round.")
@log_options
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

"""``agent start``."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from skyfed.agent.config import AgentConfig
from skyfed.cliflags import field_flags, show_defaults
from skyfed.config import load_config
from skyfed.logs import LOG_LEVELS, setup_logging


@click.group()
def main() -> None:
    """The skyfed agent: local training and the link to the coordinator."""


@main.command()
@click.option(
    "--config", "config_path", type=click.Path(exists=True, path_type=Path), help="TOML file."
)
@click.option("--cloud", help="This site's cloud (aws, gcp, azure, ...).")
@click.option("--name", help="Agent name (default <cloud>-1).")
@click.option("--coordinator", help="Coordinator HOST:PORT.")
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
@click.option("--tp", type=int, help="Local tensor-parallel ranks (processes).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), help="Where the ranks train.")
@click.option(
    "--report", type=click.Path(path_type=Path), help="JSON report, rewritten each round."
)
@field_flags(
    AgentConfig,
    {
        "seed": (int, "Seed of the initial weights (the coordinator's) and the data order."),
        "reconnect_initial_s": (float, "First reconnect delay; doubles up to the max."),
        "reconnect_max_s": (float, "Longest reconnect delay."),
        "give_up_after_s": (float, "Stop retrying after this long without a session (0: never)."),
        "threads": (int, "torch intra-op threads for local training."),
    },
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default=None,
    help="Log level (default INFO, or $SKYFED_LOG_LEVEL).",
)
def start(config_path: Path | None, log_level: str | None, **flags: object) -> None:
    """Join the federation and train until it is done."""
    try:
        config = load_config(AgentConfig, component="agent", path=config_path, flags=flags)
        from skyfed.agent.ranks import resolve_device

        resolve_device(config)  # fails early: cuda without enough GPUs
        from skyfed.agent import preflight

        preflight.check(config)  # key pair, files, task, TP plan: one line each
    except (ValueError, TypeError, OSError) as exc:
        raise click.UsageError(str(exc)) from exc
    setup_logging(log_level, who=config.name)
    from skyfed.agent.launch import run

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds: streams close, ranks reaped
    sys.exit(run(config, log_level))


show_defaults(start, AgentConfig)

"""``skyfed``: the umbrella command (the demo, the network lab)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from skyfed.config.flags import config_options
from skyfed.config.load import load_config
from skyfed.demo import DemoConfig
from skyfed.logs import setup_logging


@click.group()
def main() -> None:
    """skyfed: train one PyTorch model across several clouds."""


@main.command()
@config_options(DemoConfig)
def demo(**flags: object) -> None:
    """A coordinator and three agents (aws, gcp, azure) on this host, over real mTLS."""
    from skyfed.demo import run_demo, summary_table

    setup_logging("WARNING")
    console = Console()
    try:
        config = load_config(DemoConfig, component="demo", path=None, flags=flags)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    result = run_demo(config, console)
    console.print(summary_table(result))
    if not result.identical:
        sys.exit(1)


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write report.html and its PNGs here (default: RUN_DIR).",
)
def report(run_dir: Path, out: Path | None) -> None:
    """Plot a run (the coordinator's --run-dir) into RUN_DIR/report.html."""
    from skyfed.report import make_report

    try:
        page = make_report(run_dir, out)
    except (FileNotFoundError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(str(page))


try:  # the lab is Linux-only; the rest of the CLI works without it
    from skyfed.lab.cli import lab

    main.add_command(lab)
except ImportError:  # pragma: no cover
    pass

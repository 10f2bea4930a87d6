"""``skyfed``: the umbrella command (the demo, the network lab)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from skyfed.compression import codec_names
from skyfed.logs import setup_logging
from skyfed.wire import EXCHANGES


@click.group()
def main() -> None:
    """skyfed: train one PyTorch model across several clouds."""


@main.command()
@click.option("--rounds", type=int, default=30, show_default=True)
@click.option("--local-steps", type=int, default=4, show_default=True)
@click.option(
    "--codec",
    default="auto",
    show_default=True,
    help=f"auto (the link policy), {', '.join(codec_names())}",
)
@click.option(
    "--exchange",
    type=click.Choice(EXCHANGES),
    default="delta",
    show_default=True,
    help="delta: pseudo-gradient of local steps; gradient: DGC's momentum-corrected step.",
)
@click.option(
    "--workdir", type=click.Path(path_type=Path), help="Keep certs, logs and reports here."
)
def demo(rounds: int, local_steps: int, codec: str, exchange: str, workdir: Path | None) -> None:
    """A coordinator and three agents (aws, gcp, azure) on this host, over real mTLS."""
    from skyfed.demo import DemoConfig, run_demo, summary_table

    setup_logging("WARNING")
    console = Console()
    try:
        config = DemoConfig(
            rounds=rounds,
            local_steps=local_steps,
            codec=codec,
            exchange=exchange,
            workdir=workdir,
        )
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

"""``coordinator serve`` and ``coordinator status``."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import click
import grpc
import torch
from rich.console import Console

from skyfed.allocator import fix_mmap_threshold
from skyfed.config.flags import config_options, log_options
from skyfed.config.load import load_config
from skyfed.coordinator.admin import summary_table
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.progress import LiveView, WatchLoop
from skyfed.logs import setup_logging
from skyfed.tasks.registry import TaskLoadError

if TYPE_CHECKING:
    from skyfed.coordinator.server import Running


@click.group()
def main() -> None:
    """The skyfed coordinator: sessions, rounds, aggregation, checkpoints."""


@main.command()
@click.option(
    "--config", "config_path", type=click.Path(exists=True, path_type=Path), help="TOML file."
)
@config_options(CoordinatorConfig)
@click.option("--no-progress", is_flag=True, help="Plain log lines, no live view.")
@log_options
def serve(
    config_path: Path | None,
    log_level: str | None,
    log_format: str | None,
    no_progress: bool,
    **flags: object,
) -> None:
    """Serve the federation until its rounds are done or SIGTERM/SIGINT."""
    setup_logging(log_level, who="coordinator", fmt=log_format)
    fix_mmap_threshold()
    try:
        config = load_config(
            CoordinatorConfig, component="coordinator", path=config_path, flags=flags
        )
    except (ValueError, TypeError, OSError) as exc:
        raise click.UsageError(str(exc)) from exc
    check_paths(config)
    torch.set_num_threads(config.threads)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if config.replicas.replica:
        raise SystemExit(_serve_replica(config, stop))
    console = Console(stderr=True)
    stack = contextlib.ExitStack()
    running = start(stack, config)
    with stack:
        click.echo(f"coordinator listening on port {running.port}", err=True)
        if running.metrics_port is not None:
            host = config.metrics.metrics_listen.rpartition(":")[0]
            click.echo(f"metrics on http://{host}:{running.metrics_port}/metrics", err=True)
        live = console.is_terminal and not no_progress and log_format != "json"
        _until_done(running, stop, console if live else None)
    failure = running.federation.failure
    if failure is not None:  # a supervisor restarts it from the last checkpoint
        click.echo(f"coordinator: round driver failed: {failure!r}", err=True)
        raise SystemExit(1)
    export = config.checkpoints.export
    if export is not None and running.federation.model.round == 0:
        click.echo(
            f"coordinator: stopped before any round was applied: no trained model, "
            f"nothing written to {export}",
            err=True,
        )
        raise SystemExit(1)
    _goodbye(config, running.observer.snapshot(), console)


def _serve_replica(config: CoordinatorConfig, stop: threading.Event) -> int:
    """One replica of several (docs/failover.md): plain log lines, no live view (a standby
    has no rounds to show); the exit status is the federation's."""
    from skyfed.coordinator.replicas.serve import serve_replica

    replicas = config.replicas
    click.echo(
        f"coordinator replica {replicas.replica}, electing through {replicas.etcd}", err=True
    )
    try:
        code = serve_replica(config, stop)
    except TaskLoadError as exc:
        raise click.UsageError(f"--task: {exc}") from exc
    except (RuntimeError, OSError) as exc:
        logging.getLogger(__name__).debug("replica failed", exc_info=True)
        raise click.ClickException(str(exc)) from exc
    if code:
        click.echo(f"coordinator replica {replicas.replica}: round driver failed", err=True)
    return code


def _until_done(running: Running, stop: threading.Event, console: Console | None) -> None:
    """Wait for the driver to end (after the last round, once the agents have closed their
    streams, bounded by final_wait_s) or a signal; a live view on ``console`` meanwhile."""
    view = LiveView(running.observer.snapshot, console).start() if console else None
    try:
        while not stop.is_set() and running.driver.is_alive():
            stop.wait(0.2)
    finally:
        if view is not None:
            view.close()


def _goodbye(config: CoordinatorConfig, snap: dict, console: Console) -> None:
    console.print(summary_table(snap, title="skyfed run summary"))
    run_dir, export = config.metrics.run_dir, config.checkpoints.export
    if run_dir is not None:
        click.echo(f"run directory: {run_dir} (skyfed report {run_dir})", err=True)
    if export is not None:
        click.echo(f"model: {export}", err=True)


@main.command()
@click.option(
    "--checkpoint-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="The coordinator's --checkpoint-dir.",
)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="model.pt"
)
@click.option("--task", default="chargpt", show_default=True, help="The run's task.")
def export(checkpoint_dir: Path, out: Path, task: str) -> None:
    """Write the latest checkpoint's weights as a plain state_dict (and OUT .json)."""
    from skyfed.coordinator.export import export_checkpoint, meta_path

    try:
        meta = export_checkpoint(checkpoint_dir, out, task=task)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(
        f"{out}: round {meta['round']}, weights {meta['weights_digest'][:16]}, task {task} "
        f"({meta_path(out)})"
    )


def check_paths(config: CoordinatorConfig) -> None:
    """Every file the coordinator reads exists, every file it writes has a directory: a
    wrong path is one line at the start (exit 2), not a traceback after round 0."""
    transport, metrics = config.transport, config.metrics
    files = [("--ca", transport.ca), ("--cert", transport.cert), ("--key", transport.key)]
    for option, path in [*files, ("--etcd-ca", config.replicas.etcd_ca)]:
        if path is not None and not path.is_file():
            hint = " (check --certs)" if transport.certs is not None else ""
            raise click.UsageError(f"{option} {path} does not exist{hint}")
    if transport.crl is not None and not transport.crl.is_file():
        raise click.UsageError(f"--crl {transport.crl} does not exist (run `certs refresh-crl`)")
    if metrics.run_dir is not None:  # the coordinator's own directory: made, not checked
        try:
            metrics.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise click.UsageError(f"--run-dir {metrics.run_dir}: {exc.strerror}") from exc
    stage_dir = config.checkpoints.stage_dir
    if stage_dir is not None and not stage_dir.is_dir():
        raise click.UsageError(f"--stage-dir {stage_dir} is not a directory")
    for option, path in (
        ("--status-file", metrics.status_file),
        ("--port-file", transport.port_file),
    ):
        if path is not None and not path.parent.is_dir():
            raise click.UsageError(f"{option} {path}: directory {path.parent} does not exist")


def start(stack: contextlib.ExitStack, config: CoordinatorConfig):  # noqa: ANN201
    """The running server; a task that cannot be loaded is a usage error (exit 2), a
    checkpoint or a port it cannot use a one-line error (exit 1)."""
    from skyfed.coordinator.server import run_server

    try:
        return stack.enter_context(run_server(config))
    except TaskLoadError as exc:
        raise click.UsageError(f"--task: {exc}") from exc
    except (RuntimeError, OSError) as exc:
        logging.getLogger(__name__).debug("start failed", exc_info=True)
        raise click.ClickException(str(exc)) from exc


@main.command()
@click.option(
    "--coordinator",
    "address",
    required=True,
    help="HOST:PORT; replicas: HOST:PORT,HOST:PORT,... (the first that answers; a standby "
    "leads to the leader).",
)
@click.option("--certs", type=click.Path(path_type=Path), required=True)
@click.option("--as", "name", default="coordinator", help="Identity in --certs to call as.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--windows", is_flag=True, help="With --json: each link's raw measurement windows.")
@click.option("--watch", is_flag=True, help="Refresh a live table until Ctrl-C.")
@click.option("--interval-s", type=float, default=1.0, show_default=True, help="With --watch.")
def status(
    address: str,
    certs: Path,
    name: str,
    as_json: bool,
    windows: bool,
    watch: bool,
    interval_s: float,
) -> None:
    """Who is connected, on which codec, how fast; the last rounds; the replicas."""
    from skyfed.coordinator.admin import fetch_leader_status, fetch_snapshot, render_status

    if watch:
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        loop = WatchLoop(lambda: fetch_snapshot(address, certs, name), interval_s)
        loop.run(Console(), stop)
        return
    try:
        reply = fetch_leader_status(address.split(","), certs, name, windows=windows)
    except OSError as exc:  # a key pair that is not there: the flags are wrong
        raise click.UsageError(
            f"--certs {certs} --as {name}: {exc.strerror}: {exc.filename}"
        ) from None
    except grpc.RpcError as exc:
        raise click.ClickException(status_failure(address, name, exc)) from None
    if as_json:
        from skyfed.proto.serde import status_to_json

        click.echo(status_to_json(reply))
    else:
        render_status(reply)


def status_failure(address: str, name: str, exc: grpc.RpcError) -> str:
    """One line for a failed ``Status`` call, saying what to check."""
    code, details = exc.code(), (exc.details() or "").splitlines()
    hint = {
        grpc.StatusCode.UNAVAILABLE: "is the coordinator running there, and is it its address?",
        grpc.StatusCode.DEADLINE_EXCEEDED: "is the coordinator running there?",
        grpc.StatusCode.UNAUTHENTICATED: f"is --as {name} a certificate of this federation?",
    }.get(code, "")
    said = details[0] if details else ""
    return f"status from {address}: {code.name}: {said}" + (f" ({hint})" if hint else "")

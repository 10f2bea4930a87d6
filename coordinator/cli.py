"""``coordinator serve`` and ``coordinator status``."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from skyfed.allocator import fix_mmap_threshold
from skyfed.config import load_config
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.outer import OUTER_OPTIMIZERS
from skyfed.logs import setup_logging
from skyfed.wire import EXCHANGES


@click.group()
def main() -> None:
    """The skyfed coordinator: sessions, rounds, aggregation, checkpoints."""


@main.command()
@click.option(
    "--config", "config_path", type=click.Path(exists=True, path_type=Path), help="TOML file."
)
@click.option("--listen", help="HOST:PORT to bind (port 0: any free port).")
@click.option(
    "--certs",
    type=click.Path(path_type=Path),
    help="certs directory (ca.crt, coordinator.crt/.key, crl.pem).",
)
@click.option("--ca", type=click.Path(path_type=Path))
@click.option("--cert", type=click.Path(path_type=Path))
@click.option("--key", type=click.Path(path_type=Path))
@click.option("--crl", type=click.Path(path_type=Path))
@click.option("--task")
@click.option("--min-agents", type=int)
@click.option("--quorum", type=int)
@click.option("--round-deadline-s", type=float)
@click.option("--rounds", type=int, help="Stop after this many rounds (0: never).")
@click.option(
    "--codec", help="Link codec: auto (the link policy picks), fp32, fp16, bf16, topk, ecsgd."
)
@click.option(
    "--policy", type=click.Choice(["table", "cost"]), help="Link policy mode (codec auto)."
)
@click.option(
    "--exchange",
    type=click.Choice(EXCHANGES),
    help="What agents send: delta (local steps' pseudo-gradient) or gradient (DGC's step).",
)
@click.option("--sgd-lr", type=float, help="--exchange gradient: the SGD step size.")
@click.option("--sgd-momentum", type=float, help="--exchange gradient: the SGD momentum.")
@click.option(
    "--outer-optimizer",
    type=click.Choice(OUTER_OPTIMIZERS),
    help="Outer step on the mean pseudo-gradient: sgd (FedAvg) or nesterov (DiLoCo).",
)
@click.option("--outer-lr", type=float, help="Outer step size (sgd 1.0, nesterov 0.7).")
@click.option("--outer-momentum", type=float, help="Outer momentum (sgd 0, nesterov 0.9).")
@click.option("--heartbeat-ms", type=int, help="Agents' heartbeat interval.")
@click.option("--probe-interval-ms", type=int, help="Agents' loss probe interval.")
@click.option("--probe-port", type=int, help="UDP port of the loss probe echo (0: any, -1: off).")
@click.option("--checkpoint-dir", type=click.Path(path_type=Path))
@click.option("--port-file", type=click.Path(path_type=Path), help="Write the bound port here.")
@click.option(
    "--status-file", type=click.Path(path_type=Path), help="Status JSON, rewritten each round."
)
@click.option("--log-level", default=None)
def serve(config_path: Path | None, log_level: str | None, **flags: object) -> None:
    """Serve the federation until its rounds are done or SIGTERM/SIGINT."""
    setup_logging(log_level, who="coordinator")
    fix_mmap_threshold()
    try:
        config = load_config(
            CoordinatorConfig, component="coordinator", path=config_path, flags=flags
        )
    except (ValueError, OSError) as exc:
        raise click.UsageError(str(exc)) from exc
    from skyfed.coordinator.server import run_server

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with run_server(config) as running:
        click.echo(f"coordinator listening on port {running.port}", err=True)
        # The driver ends after the last round once the agents have closed their streams
        # (bounded by final_wait_s), or when stopped.
        while not stop.is_set() and running.driver.is_alive():
            stop.wait(0.2)


@main.command()
@click.option("--coordinator", "address", required=True, help="HOST:PORT")
@click.option("--certs", type=click.Path(path_type=Path), required=True)
@click.option("--as", "name", default="coordinator", help="Identity in --certs to call as.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--windows", is_flag=True, help="With --json: each link's raw measurement windows.")
def status(address: str, certs: Path, name: str, as_json: bool, windows: bool) -> None:
    """Who is connected, on which codec, how fast; the last rounds."""
    from skyfed.coordinator.admin import fetch_status, render_status

    reply = fetch_status(address, certs, name, windows=windows)
    if as_json:
        from google.protobuf.json_format import MessageToJson

        click.echo(MessageToJson(reply))
    else:
        render_status(reply)

"""The local demo: a coordinator and three agents on this host, real mTLS, live progress.

Each part is a separate OS process started with the same commands an operator types;
this module only wires them together, watches ``Status`` and prints the summary.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from skyfed.certs.testing import make_federation
from skyfed.config.checks import check_types, require
from skyfed.coordinator.admin import agents_table, fetch_status
from skyfed.coordinator.admin import summary_table as run_summary
from skyfed.coordinator.snapshot import to_data
from skyfed.procs import Children, children, command, wait_for_file
from skyfed.proto import serde
from skyfed.status import Status
from skyfed.wire import ExchangeKind

CLOUDS = ("aws", "gcp", "azure")


@dataclass(kw_only=True, slots=True)
class DemoConfig:
    """Knobs of ``skyfed demo``; the defaults finish in about a minute on 2 cores."""

    rounds: int = 30
    """Rounds to train."""
    local_steps: int = 4
    """Local optimizer steps per round at each agent."""
    codec: str = "auto"
    """Link codec: ``auto`` lets the link policy pick per link; a codec's name fixes it."""
    exchange: ExchangeKind = "delta"
    """What rounds carry: ``delta`` (local steps' pseudo-gradient) or ``gradient`` (DGC)."""
    workdir: Path | None = None
    """Where certificates, logs, checkpoints and reports go (default: a temporary dir)."""
    timeout_s: float = 900.0
    """Give up if the run takes longer than this."""

    def __post_init__(self) -> None:
        check_types(self, "demo")
        require("demo", self.rounds >= 1, "rounds", self.rounds, ">= 1")
        require("demo", self.local_steps >= 1, "local_steps", self.local_steps, ">= 1")


@dataclass(slots=True)
class DemoResult:
    status: Status
    reports: dict[str, dict] = field(default_factory=dict)
    report: Path | None = None
    """The run report's page (``skyfed report``)."""

    @property
    def identical(self) -> bool:
        digests = {r.get("weights_digest") for r in self.reports.values()}
        return len(self.reports) == len(CLOUDS) and digests == {self.status.weights_digest}


def run_demo(config: DemoConfig, console: Console) -> DemoResult:
    """Run the demo; without a workdir, certificates and checkpoints go to a temporary
    directory and only the run directory (history, status, report) is kept."""
    if config.workdir is None:
        with tempfile.TemporaryDirectory(prefix="skyfed-demo-") as tmp:
            kept = Path(tempfile.mkdtemp(prefix="skyfed-demo-run-"))
            return _run(config, Path(tmp), console, kept)
    config.workdir.mkdir(parents=True, exist_ok=True)
    return _run(config, config.workdir, console, config.workdir / "run")


def _run(config: DemoConfig, work: Path, console: Console, run_dir: Path) -> DemoResult:
    certs = work / "certs"
    if not (certs / "ca.crt").exists():
        make_federation(certs)
    started = time.monotonic()
    with children(work / "logs") as kids:
        port = _start_coordinator(kids, config, work, run_dir)
        for i, cloud in enumerate(CLOUDS):
            flags = {
                "--cloud": cloud,
                "--coordinator": f"localhost:{port}",
                "--certs": certs,
                "--shard": i,
                "--num-shards": len(CLOUDS),
                "--local-steps": config.local_steps,
                "--report": work / f"{cloud}.json",
            }
            kids.start(
                cloud, command("agent", "start", *(str(x) for kv in flags.items() for x in kv))
            )
        status = _watch(kids, config, work, run_dir, f"localhost:{port}", console, started)
        for cloud in CLOUDS:
            kids.procs[cloud].wait(timeout=30)
    reports = {
        c: json.loads((work / f"{c}.json").read_text())
        for c in CLOUDS
        if (work / f"{c}.json").exists()
    }
    result = DemoResult(status, reports)
    from skyfed.report import make_report  # matplotlib: loaded for the run's end only

    result.report = make_report(run_dir)
    return result


def _start_coordinator(kids: Children, config: DemoConfig, work: Path, run_dir: Path) -> int:
    port_file = work / "coordinator.port"
    port_file.unlink(missing_ok=True)
    flags = {
        "--certs": work / "certs",
        "--listen": "127.0.0.1:0",
        "--port-file": port_file,
        "--run-dir": run_dir,
        "--rounds": config.rounds,
        "--min-agents": len(CLOUDS),
        "--codec": config.codec,
        "--exchange": config.exchange,
        "--checkpoint-dir": work / "checkpoints",
    }
    argv = command("coordinator", "serve", *(str(x) for kv in flags.items() for x in kv))
    return int(wait_for_file(port_file, 60, kids.start("coordinator", argv)))


def _watch(
    kids: Children,
    config: DemoConfig,
    work: Path,
    run_dir: Path,
    address: str,
    console: Console,
    started: float,
) -> Status:
    """Live progress from ``Status``; the final figures come from the coordinator's file."""
    progress = Progress(
        TextColumn("[bold]rounds"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    task = progress.add_task("rounds", total=config.rounds, loss="-")
    coordinator = kids.procs["coordinator"]
    with Live(progress, console=console, refresh_per_second=4, transient=False) as live:
        while coordinator.poll() is None:
            if time.monotonic() - started > config.timeout_s:
                raise TimeoutError(f"the demo did not finish within {config.timeout_s} s")
            try:
                status = fetch_status(address, work / "certs", "coordinator", timeout_s=2)
            except Exception:  # noqa: BLE001 - the coordinator may be between states; poll again
                time.sleep(0.3)
                continue
            loss = f"{status.rounds[-1].mean_loss:.3f}" if status.rounds else "-"
            progress.update(task, completed=len(status.rounds), loss=loss)
            live.update(Group(progress, agents_table(to_data(status))))
            if status.finished:
                break
            time.sleep(0.3)
    if coordinator.wait(timeout=30) != 0:
        raise RuntimeError(
            f"coordinator exited with {coordinator.returncode}:\n{kids.log('coordinator')[-2000:]}"
        )
    final = serde.status_from_json((run_dir / "status.json").read_text())
    progress.update(task, completed=len(final.rounds))
    return final


def summary_table(result: DemoResult) -> Table:
    table = run_summary(to_data(result.status), title="skyfed demo summary")
    for name, rep in sorted(result.reports.items()):
        table.add_row(
            f"agent {name}", f"weights {rep['weights_digest'][:16]} after round {rep['round']}"
        )
    table.add_row("verdict", "all agents bit-identical" if result.identical else "AGENTS DIFFER")
    if result.report is not None:
        table.add_row("report", str(result.report))
    return table

"""One way for a bench to keep a measured run: ``bench/results/<date>-<bench>-<what>.md``
with the command, the commit, the date, the host and the output (docs/results.md)."""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def record(
    bench: str, what: str, argv: list[str], lines: list[str], title: str | None = None
) -> Path:
    """Write ``lines`` (or append them, for a second run of the same record on one day)."""
    today = datetime.date.today().isoformat()
    path = RESULTS / f"{today}-{bench}-{what}.md"
    path.parent.mkdir(exist_ok=True)
    commit = _commit()
    free = subprocess.run(["free", "-g"], capture_output=True, text=True, check=False).stdout
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    text = [
        f"# {title or f'bench/{bench}.py: {what}'}",
        "",
        f"- command: `{_lock_prefix()}python bench/{bench}.py {shlex.join(argv)}`",
        f"- commit: `{commit}`",
        f"- date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
        f"- host: {host()}, load average {load} at the end"
        " (the host may be shared with other jobs)",
        "",
        "```",
        free.rstrip(),
        "```",
        "",
        *lines,
        "",
    ]
    if path.exists():
        with path.open("a") as f:
            f.write("\n".join(text))
    else:
        path.write_text("\n".join(text))
    return path


def _lock_prefix() -> str:
    """``flock LOCK `` when an ancestor process is the heavy-run lock's ``flock``, else ''
    (the record then says the run had the host's heavy work to itself)."""
    pid = os.getppid()
    while pid > 1:
        proc = Path(f"/proc/{pid}")
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            pid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return ""
        if args and Path(args[0].decode()).name == "flock" and len(args) > 1:
            return f"flock {args[1].decode()} "
    return ""


@contextlib.contextmanager
def recording(bench: str, what: str | None, argv: list[str]) -> Iterator[None]:
    """Print as usual and, with ``what``, keep what was printed as its record (on exit)."""
    if what is None:
        yield
        return
    kept = io.StringIO()
    out = sys.stdout

    class Tee(io.TextIOBase):
        def write(self, text: str) -> int:
            kept.write(text)
            return out.write(text)

        def flush(self) -> None:
            out.flush()

    with contextlib.redirect_stdout(Tee()):
        yield
    print(f"recorded: {record(bench, what, argv, kept.getvalue().splitlines())}")


def _commit() -> str:
    """The checkout's commit, or ``SKYFED_COMMIT`` where the runner says it: a copy of the
    tree run on the lent GPU machine carries a ``.git`` of the session's starting commit,
    not of the tree's."""
    said = os.environ.get("SKYFED_COMMIT")
    if said:
        return said
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:  # no git on this host
        out = ""
    return out or "unknown (no git here, SKYFED_COMMIT unset)"


def host() -> str:
    """The host as a run names it: its cores and CPU model (a seed's trajectory repeats
    only on one CPU model: their kernels round differently)."""
    return f"nproc {os.cpu_count()}, {_cpu_model()}"


def _cpu_model() -> str:
    """The CPU's model name: figures from hosts of another model do not compare."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU model unknown"

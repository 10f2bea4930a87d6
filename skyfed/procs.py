"""Starting the real ``coordinator`` and ``agent`` commands as child processes, and reaping them."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn


def command(component: str, *args: str) -> list[str]:
    """``python -m skyfed.<component> ...``: the console script, independent of PATH."""
    return [sys.executable, "-m", f"skyfed.{component}", *args]


def terminate(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace_s: float = 5.0) -> int:
    """Signal ``proc`` (SIGTERM by default), SIGKILL it after ``grace_s``, close its pipes."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return proc.returncode


class Children:
    """Child processes that are always reaped: SIGTERM, then SIGKILL after a grace period."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        log.close()
        self.procs[name] = proc
        return proc

    def stop(self, name: str, sig: int = signal.SIGTERM, grace_s: float = 10.0) -> int:
        return terminate(self.procs[name], sig, grace_s)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def children(log_dir: Path) -> Iterator[Children]:
    kids = Children(log_dir)
    try:
        yield kids
    finally:
        kids.stop_all()


def wait_for_file(path: Path, timeout_s: float, proc: subprocess.Popen | None = None) -> str:
    """The file's text once it exists and is non-empty; fails early if ``proc`` dies."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before writing {path}")
        time.sleep(0.05)
    raise TimeoutError(f"{path} did not appear within {timeout_s} s")


def exit_rank(code: int) -> NoReturn:
    """End a rank process whose site has stopped and whose process groups are destroyed.

    Its supervisor (``agent start``, srun, torchrun) judges it by its exit code alone, and
    interpreter teardown from here sometimes aborts in torch's C++ destructors ("terminate
    called without an active exception", SIGABRT: about one tp=2 run in four with torch
    2.13, either rank; a two-rank ``skyfed.Site`` script about one in ten), which would fail
    a finished site. So flush and leave at once: atexit handlers do not run.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

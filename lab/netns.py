"""Network namespaces: create, configure, run commands in, delete, and reap stale ones."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from skyfed.netinfo import STRIPED_NOTSENT_LOWAT

logger = logging.getLogger(__name__)

PREFIX = "sfl"
"""Every namespace the lab makes is called ``sfl-<owner pid>-<instance>-<host>``."""
NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-")
_instances = itertools.count()

TCP_SETTINGS: dict[str, str] = {
    "net.ipv4.tcp_congestion_control": "cubic",
    "net.ipv4.tcp_rmem": "4096 131072 33554432",
    "net.ipv4.tcp_wmem": "4096 16384 33554432",
    "net.ipv4.tcp_no_metrics_save": "1",
    "net.ipv4.tcp_notsent_lowat": str(STRIPED_NOTSENT_LOWAT),
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
}
"""Pinned in every namespace: the host default (BBR) ignores random loss, CUBIC does not.
Unsent socket data is bounded as docs/striping.md#send-buffers tells hosts that stripe.
IPv6 is off so that no neighbour discovery crosses (and is counted on) the shaped links."""


class LabError(RuntimeError):
    """The lab could not build or run what it was asked to."""


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 30.0) -> str:
    """Run a short command, return its stdout; ``LabError`` with its stderr on failure."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def new_instance_prefix() -> str:
    """A name prefix no other lab instance on this host uses."""
    return f"{PREFIX}-{os.getpid()}-{next(_instances)}"


def list_namespaces() -> list[str]:
    """Names of all network namespaces ``ip netns`` knows."""
    out = run(["ip", "-j", "netns", "list"], check=False).strip()
    return [entry["name"] for entry in json.loads(out)] if out else []


@dataclass(slots=True)
class Namespace:
    """One named network namespace (a lab host)."""

    name: str
    """Full namespace name, starting with the lab instance's prefix."""

    @property
    def path(self) -> str:
        """The bind mount that holds the namespace open."""
        return str(NETNS_DIR / self.name)

    def create(self) -> None:
        """Add the namespace, bring up ``lo`` and pin TCP settings."""
        allow_congestion_control(TCP_SETTINGS["net.ipv4.tcp_congestion_control"])
        run(["ip", "netns", "add", self.name])
        self.ip("link", "set", "lo", "up")
        self.set_sysctls(TCP_SETTINGS)

    def ip(self, *args: str) -> str:
        """``ip -n NAME ...``."""
        return run(["ip", "-n", self.name, *args])

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` inside this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def set_sysctls(self, settings: Mapping[str, str]) -> None:
        """Write per-namespace sysctls (through /proc/sys, so no procps is needed)."""
        script = "; ".join(
            f"echo '{value}' > /proc/sys/{key.replace('.', '/')}" for key, value in settings.items()
        )
        run(self.exec_argv(["sh", "-ec", script]))

    def write_hosts(self, hosts: Mapping[str, str]) -> None:
        """An /etc/hosts seen only inside this namespace (``ip netns exec`` mounts it)."""
        folder = ETC_NETNS / self.name
        folder.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost"] + [f"{addr} {name}" for name, addr in hosts.items()]
        (folder / "hosts").write_text("\n".join(lines) + "\n")

    def link_stats(self, dev: str) -> dict[str, int]:
        """The device's TX counters (``packets``, ``dropped``, ...)."""
        info = json.loads(self.ip("-s", "-j", "link", "show", "dev", dev))[0]
        return dict(info["stats64"]["tx"])

    def pids(self) -> list[int]:
        """Processes running inside the namespace."""
        out = run(["ip", "netns", "pids", self.name], check=False)
        return [int(p) for p in out.split()]

    def kill_all(self, grace_s: float = 3.0) -> None:
        """SIGTERM every process inside, then SIGKILL what is left after ``grace_s``."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.pids()
            for pid in pids:
                _kill(pid, sig)
            deadline = time.monotonic() + grace_s
            while pids and time.monotonic() < deadline and self.pids():
                time.sleep(0.05)

    def delete(self) -> None:
        """Kill what runs inside, delete the namespace and its /etc/netns folder."""
        if self.name in list_namespaces():
            self.kill_all()
            run(["ip", "netns", "delete", self.name], check=False)
        shutil.rmtree(ETC_NETNS / self.name, ignore_errors=True)


def allow_congestion_control(name: str = "cubic") -> None:
    """Let namespaces pick ``name``: a non-initial namespace may only use the host's allowed list.

    This adds to the host's *allowed* list only; the host's own default is left alone.
    """
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
    names = allowed.read_text().split()
    if name not in names:
        allowed.write_text(" ".join([*names, name]) + "\n")
        logger.info("[Lab.Sysctl] allowed congestion control %s", name)


def reap_stale(prefix: str = PREFIX) -> list[str]:
    """Delete namespaces named ``<prefix>-<pid>-...`` whose owner process is gone."""
    reaped = []
    for name in list_namespaces():
        match = _NAME_RE.match(name)
        if match and name.startswith(prefix) and not _alive(int(match.group(1))):
            Namespace(name).delete()
            reaped.append(name)
    if reaped:
        logger.warning("[Lab.Reap] removed stale namespaces %s", reaped)
    return reaped


def why_unavailable() -> str | None:
    """None where the lab can run here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the network lab needs root (network namespaces, TUN devices)"
    if shutil.which("ip") is None:
        return "the network lab needs iproute2's `ip` command"
    probe = Namespace(f"{new_instance_prefix()}-probe")
    try:
        probe.create()
    except (LabError, OSError) as exc:
        return f"cannot create a network namespace here: {exc}"
    finally:
        probe.delete()
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun for the userspace shaper"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)

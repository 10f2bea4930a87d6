"""The lab itself: a star of namespaces (coordinator in the middle), one shaped link per agent."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from types import TracebackType

from skyfed.lab.netns import (
    LabError,
    Namespace,
    allow_congestion_control,
    new_instance_prefix,
    reap_stale,
)
from skyfed.lab.profiles import Catalog, LinkProfile, Schedule, load_catalog
from skyfed.lab.shapers import Endpoint, Link, Mechanism, choose_mechanism, make_link

logger = logging.getLogger(__name__)

COORDINATOR = "coordinator"
"""Host name of the coordinator inside the lab (resolvable in every lab namespace)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class AgentSpec:
    """One agent host and the profile of its link to the coordinator."""

    name: str
    """Agent name, also its host name in the lab (``aws-1``)."""
    profile: str = "lan"
    """Name of the link profile between this agent and the coordinator."""

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_" for c in self.name):
            raise ValueError(f"invalid name: {self.name!r}")


@dataclass(kw_only=True, slots=True, frozen=True)
class LabSpec:
    """The lab's topology: a coordinator and agents, each agent on its own shaped link."""

    agents: tuple[AgentSpec, ...]
    """The agents, in order; agent i (from 1) gets the network's i-th /24."""
    network: IPv4Network = IPv4Network("10.77.0.0/16")
    """Private block used only inside the lab's namespaces; the coordinator is its .0.1."""
    mechanism: str = "auto"
    """``auto`` (netem where the kernel has it, else tun), ``netem`` or ``tun``."""
    initcwnd: int = 0
    """Initial congestion and receive windows, in segments, of the links' routes on both
    ends (``ip route ... initcwnd N initrwnd N``; 0: the kernel's, 10). A real host can set
    the same per route (docs/wan.md)."""

    def __post_init__(self) -> None:
        names = [a.name for a in self.agents]
        if not names or len(set(names)) != len(names) or COORDINATOR in names:
            raise ValueError(f"invalid agents: {names!r}")
        if not self.network.is_private or self.network.prefixlen > 16:
            raise ValueError(f"invalid network: {self.network} (need a private /16 or larger)")
        if len(self.agents) > 250:
            raise ValueError(f"invalid agents: {len(self.agents)} (at most 250)")
        if self.mechanism not in ("auto", "netem", "tun"):
            raise ValueError(f"invalid mechanism: {self.mechanism!r}")
        if not 0 <= self.initcwnd <= 1024:
            raise ValueError(f"invalid initcwnd: {self.initcwnd!r} (0..1024 segments)")

    def coordinator_addr(self) -> IPv4Address:
        """The coordinator's service address (on its loopback, reachable over every link)."""
        return self.network[1]

    def link_addrs(self, index: int) -> tuple[IPv4Address, IPv4Address]:
        """(agent end, coordinator end) of agent ``index``'s link (0-based)."""
        base = self.network[(index + 1) * 256]
        return base + 2, base + 1


@dataclass(slots=True)
class LabProcess:
    """A command running inside one lab host."""

    host: str
    argv: list[str]
    popen: subprocess.Popen[bytes]
    log_path: Path | None = None

    def stop(self, grace_s: float = 5.0) -> int:
        """SIGTERM the command's process group, SIGKILL it after ``grace_s``; its exit code."""
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        return self.popen.returncode


@dataclass(slots=True)
class Lab:
    """Builds the topology on enter, tears every namespace, link and process down on exit."""

    spec: LabSpec
    catalog: Catalog = field(default_factory=load_catalog)
    prefix: str = field(default_factory=new_instance_prefix)
    mechanism: Mechanism = "tun"
    hosts: dict[str, Namespace] = field(default_factory=dict)
    links: dict[str, Link] = field(default_factory=dict)
    processes: list[LabProcess] = field(default_factory=list)
    _schedules: list[ScheduleRunner] = field(default_factory=list)
    _closed: bool = False

    def __enter__(self) -> Lab:
        if self.hosts or self._closed:
            raise LabError(f"lab {self.prefix} was already built; make a new Lab")
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _build(self) -> None:
        reap_stale()
        self.mechanism = choose_mechanism(self.spec.mechanism)
        coord = self._add_host(COORDINATOR)
        coord.ip("addr", "add", f"{self.spec.coordinator_addr()}/32", "dev", "lo")
        for index, agent in enumerate(self.spec.agents):
            self._add_link(index, agent, coord)
        names = {COORDINATOR: str(self.spec.coordinator_addr())}
        names |= {a.name: str(self.address(a.name)) for a in self.spec.agents}
        for ns in self.hosts.values():
            ns.write_hosts(names)
        logger.info(
            "[Lab.Up] prefix=%s mechanism=%s hosts=%d", self.prefix, self.mechanism, len(self.hosts)
        )

    def _add_host(self, host: str) -> Namespace:
        ns = Namespace(f"{self.prefix}-{host}")
        self.hosts[host] = ns
        ns.create()
        return ns

    def _add_link(self, index: int, agent: AgentSpec, coord: Namespace) -> None:
        agent_addr, coord_addr = self.spec.link_addrs(index)
        a = Endpoint(ns=self._add_host(agent.name), dev="wan0", addr=agent_addr)
        b = Endpoint(ns=coord, dev=f"l{index}-{agent.name}"[:15], addr=coord_addr)
        profile = self.catalog.profile(agent.profile)
        link = make_link(self.mechanism, a, b, profile)
        self.links[agent.name] = link
        link.open()
        # Congestion control per route (both ends; a passive open takes its route's too):
        # gRPC's Python API offers no socket hook, a route metric reaches every socket.
        allow_congestion_control(profile.congestion)
        cc = ["congctl", "lock", profile.congestion]
        if self.spec.initcwnd:
            cc += ["initcwnd", str(self.spec.initcwnd), "initrwnd", str(self.spec.initcwnd)]
        a.ns.ip("route", "add", str(self.spec.network), "via", str(coord_addr), "dev", "wan0", *cc)
        coord.ip("route", "replace", str(agent_addr), "dev", b.dev, "src", str(coord_addr), *cc)

    def address(self, host: str) -> IPv4Address:
        """A host's address: the coordinator's service address, or an agent's link address."""
        if host == COORDINATOR:
            return self.spec.coordinator_addr()
        names = [a.name for a in self.spec.agents]
        return self.spec.link_addrs(names.index(host))[0]

    def link(self, agent: str) -> Link:
        """The shaped link between ``agent`` and the coordinator."""
        return self.links[agent]

    def spawn(
        self,
        host: str,
        argv: Sequence[str],
        *,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> LabProcess:
        """Start ``argv`` inside ``host``'s namespace; output goes to ``log_path``."""
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            popen = subprocess.Popen(
                self.hosts[host].exec_argv(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        finally:
            if log_path:
                out.close()  # type: ignore[union-attr]
        proc = LabProcess(host=host, argv=list(argv), popen=popen, log_path=log_path)
        self.processes.append(proc)
        logger.info("[Lab.Spawn] host=%s argv=%s", host, " ".join(argv))
        return proc

    def run_schedule(self, agent: str, schedule: Schedule) -> ScheduleRunner:
        """Apply ``schedule`` to ``agent``'s link in the background."""
        runner = ScheduleRunner(self.link(agent), schedule, self.catalog)
        self._schedules.append(runner)
        runner.start()
        return runner

    def partition(self, agent: str, down_s: float) -> ScheduleRunner:
        """Take ``agent``'s link down for ``down_s`` seconds, then restore its profile."""
        return self.run_schedule(agent, Schedule.partition(self.link(agent).profile.name, down_s))

    def close(self) -> None:
        """Stop schedules, processes, links; delete namespaces. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for runner in self._schedules:
            runner.stop()
        for proc in self.processes:
            proc.stop()
        for link in self.links.values():
            link.close()
        for ns in self.hosts.values():
            ns.delete()
        logger.info("[Lab.Down] prefix=%s", self.prefix)


class ScheduleRunner(threading.Thread):
    """Steps one link through a schedule; ``stop`` ends it early and leaves the link as is."""

    def __init__(self, link: Link, schedule: Schedule, catalog: Catalog) -> None:
        super().__init__(name=f"schedule-{schedule.name}", daemon=True)
        self.link = link
        self.schedule = schedule
        self.base: LinkProfile = link.profile
        self.catalog = catalog
        self.applied: list[tuple[float, str, bool]] = []
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            for step in self.schedule.steps:
                if self._stop_event.is_set():
                    return
                profile = self.catalog.resolve(step, self.base)
                self.link.set_profile(profile)
                self.applied.append((time.monotonic(), profile.name, profile.down))
                self._stop_event.wait(step.hold_s)
        except BaseException as exc:  # reported by stop(); a thread cannot raise to its owner
            self.error = exc

    def stop(self) -> None:
        """End the schedule now and wait for the thread."""
        self._stop_event.set()
        self.join(timeout=10)
        if self.error is not None:
            raise LabError(f"schedule {self.schedule.name} failed: {self.error}")


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def tear_down_on_signals() -> None:
    """SIGTERM unwinds like Ctrl-C, so every namespace and process is torn down.

    SIGINT is set back to Python's Ctrl-C handler too: a shell starts background jobs
    with SIGINT ignored and Python keeps an inherited ignore, which would leave a lab
    started from a script deaf to ``kill -INT`` and its namespaces behind. Call it from the
    main thread of a program that builds labs (the lab CLI, the benches)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    signal.signal(signal.SIGINT, signal.default_int_handler)


__all__ = [
    "AgentSpec",
    "COORDINATOR",
    "Lab",
    "LabError",
    "LabProcess",
    "LabSpec",
    "tear_down_on_signals",
]

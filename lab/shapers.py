"""Shaped links between two namespaces: kernel ``tc netem`` where it exists, else tbf + eBPF drop + a TUN delay line."""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Literal

from skyfed.lab.dropper import Dropper
from skyfed.lab.netns import LabError, Namespace, new_instance_prefix, run
from skyfed.lab.profiles import LinkProfile
from skyfed.procs import terminate

logger = logging.getLogger(__name__)

Mechanism = Literal["netem", "tun"]
MTU = 1500
TXQUEUELEN = 10000
"""Deep device queues: when the forwarder falls behind, the kernel drops at the TUN queue."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Endpoint:
    """One end of a link: a namespace, its device there and its address on the link."""

    ns: Namespace
    """The namespace the device lives in."""
    dev: str
    """Device name inside ``ns`` (at most 15 characters)."""
    addr: IPv4Address
    """This end's address on the point-to-point link."""

    def __post_init__(self) -> None:
        if not 0 < len(self.dev) <= 15:
            raise ValueError(f"invalid dev: {self.dev!r}")


class Link(ABC):
    """A bidirectional shaped link; ``a`` is the agent side, ``b`` the coordinator side."""

    mechanism: Mechanism

    def __init__(self, a: Endpoint, b: Endpoint, profile: LinkProfile) -> None:
        self.a = a
        self.b = b
        self.profile = profile
        self._lock = threading.Lock()

    def open(self) -> None:
        """Create both devices, address them and apply the profile."""
        self._create_devices()
        for end, peer in ((self.a, self.b), (self.b, self.a)):
            end.ns.ip("link", "set", "dev", end.dev, "mtu", str(MTU), "txqueuelen", str(TXQUEUELEN))
            end.ns.ip("addr", "add", str(end.addr), "peer", str(peer.addr), "dev", end.dev)
            end.ns.ip("link", "set", "dev", end.dev, "up")
        logger.info(
            "[Lab.Link] %s <-> %s mechanism=%s profile=%s",
            self.a.ns.name,
            self.b.ns.name,
            self.mechanism,
            self.profile.name,
        )

    def set_profile(self, profile: LinkProfile) -> None:
        """Change the link's shaping now (a schedule step, a partition)."""
        with self._lock:
            self._apply(profile)
            self.profile = profile
        logger.info("[Lab.Link] dev=%s profile=%s down=%s", self.a.dev, profile.name, profile.down)

    def tx_drops(self) -> int:
        """Packets the kernel dropped at either device's transmit queue (shaper fell behind)."""
        return sum(end.ns.link_stats(end.dev)["dropped"] for end in (self.a, self.b))

    @abstractmethod
    def _create_devices(self) -> None: ...

    @abstractmethod
    def _apply(self, profile: LinkProfile) -> None: ...

    @abstractmethod
    def close(self) -> None:
        """Remove what the link made outside its namespaces (processes)."""


class TunLink(Link):
    """Where the kernel has no netem: the kernel shapes rate (``tbf`` on each TUN's egress)
    and loss (an eBPF drop at each TUN's ingress, lab/dropper.py); a forwarder process
    between the two TUN devices adds only the delay and jitter (docs/lab.md)."""

    mechanism: Mechanism = "tun"

    def __init__(self, a: Endpoint, b: Endpoint, profile: LinkProfile, *, seed: int = 0) -> None:
        super().__init__(a, b, profile)
        self.seed = seed
        self._proc: subprocess.Popen[str] | None = None
        self._droppers: list[Dropper] = []

    def _create_devices(self) -> None:
        argv = [sys.executable, "-m", "skyfed.lab.forwarder"]
        argv += ["--ns-a", self.a.ns.path, "--dev-a", self.a.dev]
        argv += ["--ns-b", self.b.ns.path, "--dev-b", self.b.dev]
        argv += ["--profile", json.dumps(self.profile.to_dict()), "--seed", str(self.seed)]
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if line != "ready":
            self.close()
            raise LabError(f"forwarder for {self.a.dev} did not start (said {line!r})")
        try:
            for end in (self.a, self.b):
                self._droppers.append(Dropper(end.ns.path, end.dev, self.profile.loss))
        except OSError as exc:
            self.close()
            raise LabError(f"cannot attach the loss program to {self.a.dev}: {exc}") from exc
        self._set_rate(self.profile)

    def _apply(self, profile: LinkProfile) -> None:
        self._send({"profile": profile.to_dict()})
        for dropper in self._droppers:
            dropper.set_loss(profile.loss)
        if self.profile.rate_mbit and not profile.rate_mbit:
            for end in (self.a, self.b):
                run(["tc", "-n", end.ns.name, "qdisc", "del", "dev", end.dev, "root"])
        self._set_rate(profile)

    def _set_rate(self, profile: LinkProfile) -> None:
        """tbf on each device's egress: the direction's bottleneck and its tail-drop queue."""
        if profile.rate_mbit:
            for end in (self.a, self.b):
                run(["tc", "-n", end.ns.name, *tbf_command(end.dev, profile, "root")[1:]])

    def _send(self, cmd: dict[str, object]) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise LabError(f"forwarder for {self.a.dev} is not running")
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(cmd) + "\n")
        self._proc.stdin.flush()

    def close(self) -> None:
        droppers, self._droppers = self._droppers, []
        for dropper in droppers:
            dropper.close()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # the forwarder's cue to stop; SIGTERM follows
        terminate(proc)


class NetemLink(Link):
    """Kernel shaper: a veth pair with ``netem`` (delay, jitter, loss) and ``tbf`` (rate)."""

    mechanism: Mechanism = "netem"

    def _create_devices(self) -> None:
        veth = ["ip", "link", "add", "name", self.a.dev, "netns", self.a.ns.name, "type", "veth"]
        run([*veth, "peer", "name", self.b.dev, "netns", self.b.ns.name])
        self._apply(self.profile)

    def _apply(self, profile: LinkProfile) -> None:
        for end in (self.a, self.b):
            if self.profile.rate_mbit and not profile.rate_mbit:
                run(["tc", "-n", end.ns.name, "qdisc", "del", "dev", end.dev, "parent", "1:1"])
            for argv in netem_commands(end.dev, profile):
                run(["tc", "-n", end.ns.name, *argv[1:]])

    def close(self) -> None:
        """Devices vanish with their namespaces; nothing lives outside them."""


def netem_commands(dev: str, profile: LinkProfile, *, verb: str = "replace") -> list[list[str]]:
    """``tc`` command lines that shape egress of ``dev`` with ``profile`` (one direction)."""
    netem = ["tc", "qdisc", verb, "dev", dev, "root", "handle", "1:", "netem"]
    netem += ["limit", "100000", "delay", f"{profile.delay_ms:g}ms"]
    if profile.jitter_ms:
        netem += [f"{profile.jitter_ms:g}ms", "distribution", "normal"]
    netem += ["loss", f"{100.0 if profile.down else profile.loss_pct:g}%"]
    commands = [netem]
    if profile.rate_mbit:
        commands.append(tbf_command(dev, profile, "parent 1:1", verb=verb))
    return commands


def tbf_command(dev: str, profile: LinkProfile, parent: str, *, verb: str = "replace") -> list[str]:
    """The ``tc`` command line of the rate limit: ``profile.rate_mbit`` with a bucket of
    4 ms at that rate (at least 4 packets) and a tail-drop queue of ``queue_ms``."""
    burst_b = max(MTU * 4, int(profile.rate_mbit * 1e6 / 8 / 250))
    tbf = ["tc", "qdisc", verb, "dev", dev, *parent.split(), "handle", "10:", "tbf"]
    tbf += ["rate", f"{profile.rate_mbit:g}mbit", "burst", str(burst_b)]
    return [*tbf, "latency", f"{profile.queue_ms:g}ms"]


@functools.cache
def netem_available() -> bool:
    """Whether this kernel has ``sch_netem`` (tried on ``lo`` of a scratch namespace)."""
    scratch = Namespace(f"{new_instance_prefix()}-netem")
    try:
        scratch.create()
        run(scratch.exec_argv(["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]))
        return True
    except LabError as exc:
        logger.info("[Lab.Shaper] no sch_netem here: %s", exc)
        return False
    finally:
        scratch.delete()


def choose_mechanism(requested: str = "auto") -> Mechanism:
    """``netem`` where the kernel has it, else ``tun``; ``requested`` may force either."""
    if requested not in ("auto", "netem", "tun"):
        raise ValueError(f"invalid mechanism: {requested!r}")
    if requested == "tun":
        return "tun"
    if netem_available():
        return "netem"
    if requested == "netem":
        raise LabError("mechanism netem requested, but this kernel has no sch_netem")
    return "tun"


def make_link(mechanism: Mechanism, a: Endpoint, b: Endpoint, profile: LinkProfile) -> Link:
    """A link of the chosen mechanism (not yet opened)."""
    return NetemLink(a, b, profile) if mechanism == "netem" else TunLink(a, b, profile)

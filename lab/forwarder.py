"""The lab's delay line: one process per link, forwarding IP packets between two TUN devices.

Run as ``python -m skyfed.lab.forwarder --ns-a A --dev-a X --ns-b B --dev-b Y --profile JSON``.
It creates TUN device X inside network namespace A and Y inside B, prints ``ready`` and then
moves every packet read from one device to the other after the link profile's delay and
jitter. Rate and loss are the kernel's (``tbf`` and an eBPF drop, lab/shapers.py), so this
loop does the least per packet that userspace must, and it runs at real-time priority so a
busy host's training processes cannot starve it (docs/lab.md). Control lines on stdin
(JSON): ``{"profile": {...}}`` replaces the profile. It exits on end of stdin (its parent
is gone) or SIGTERM.

Jitter shifts the one-way delay by a normal deviate redrawn every 5 ms. Each direction is
a FIFO whose release times never decrease (no reordering), so the queue is a deque and its
head is always the next packet due. ``select`` waits with microsecond
timeouts (``poll``/``epoll`` round them to whole milliseconds).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import logging
import os
import random
import select
import signal
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000
BURST = 64
"""Packets read from one device before the other gets a turn."""
MAX_PACKET = 65535
JITTER_PERIOD_S = 0.005
"""Jitter is a normal deviate redrawn this often: packets keep their order, and the mean
one-way delay stays the profile's (an independent draw per packet, kept in order, would
bias it upward by the running maximum)."""


RT_PRIORITY = 20
"""SCHED_FIFO priority of the forwarder: above every SCHED_OTHER process (training), far
below the kernel's own threads; the kernel's RT throttling still leaves 5 % to the rest."""


@dataclass(slots=True)
class Impairment:
    """The profile as the hot loop uses it: seconds."""

    delay_s: float = 0.0
    jitter_s: float = 0.0

    @classmethod
    def from_profile(cls, p: dict[str, Any]) -> Impairment:
        """From a ``LinkProfile.to_dict()`` (its rate and loss are the kernel's business)."""
        return cls(delay_s=p["rtt_ms"] / 2000.0, jitter_s=p["jitter_ms"] / 1000.0)


@dataclass(slots=True)
class Direction:
    """Packets read from ``src`` and written, when due, to ``dst``."""

    src: int
    dst: int
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)
    last_release: float = 0.0
    jitter_s: float = 0.0
    jitter_until: float = 0.0
    received: int = 0
    forwarded: int = 0
    write_errors: int = 0

    def ingest(self, now: float, imp: Impairment, rng: random.Random) -> None:
        """Read up to BURST packets and schedule each one's release."""
        if imp.jitter_s and now >= self.jitter_until:
            self.jitter_s = rng.gauss(0.0, imp.jitter_s)
            self.jitter_until = now + JITTER_PERIOD_S
        delay = max(0.0, imp.delay_s + self.jitter_s) if imp.jitter_s else imp.delay_s
        release = max(now + delay, self.last_release)  # never before an earlier packet
        self.last_release = release
        queue, src = self.queue, self.src
        for _ in range(BURST):
            try:
                pkt = os.read(src, MAX_PACKET)
            except BlockingIOError:
                return
            self.received += 1
            queue.append((release, pkt))

    def flush(self, now: float) -> None:
        """Write every packet that is due."""
        queue = self.queue
        while queue and queue[0][0] <= now:
            try:
                os.write(self.dst, queue.popleft()[1])
                self.forwarded += 1
            except OSError:
                self.write_errors += 1


def open_tun_in_netns(netns_path: str, name: str) -> int:
    """Create TUN device ``name`` inside the namespace at ``netns_path``; return its fd."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns_path, os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({netns_path})")
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI))
    finally:
        if libc.setns(home, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns(home)")
        os.close(target)
        os.close(home)
    return fd


class Forwarder:
    """The select loop over two TUN devices and the control channel."""

    def __init__(self, fd_a: int, fd_b: int, imp: Impairment, seed: int) -> None:
        self.ab = Direction(fd_a, fd_b)
        self.ba = Direction(fd_b, fd_a)
        self.imp = imp
        self.rng = random.Random(seed)
        self.running = True

    def run(self, control: int) -> None:
        """Forward until the control channel closes or ``stop`` is called."""
        readers = [self.ab.src, self.ba.src, control]
        while self.running:
            ready, _, _ = select.select(readers, [], [], self._timeout())
            now = time.monotonic()
            if self.ab.src in ready:
                self.ab.ingest(now, self.imp, self.rng)
            if self.ba.src in ready:
                self.ba.ingest(now, self.imp, self.rng)
            if control in ready:
                self._control(control)
            now = time.monotonic()
            self.ab.flush(now)
            self.ba.flush(now)

    def _timeout(self) -> float | None:
        heads = [d.queue[0][0] for d in (self.ab, self.ba) if d.queue]
        if not heads:
            return None
        return max(0.0, min(heads) - time.monotonic())

    def _control(self, control: int) -> None:
        data = os.read(control, 65536)
        if not data:
            self.running = False
            return
        for line in data.decode().splitlines():
            self._command(json.loads(line))

    def _command(self, cmd: dict[str, Any]) -> None:
        if "profile" in cmd:
            self.imp = Impairment.from_profile(cmd["profile"])
            logger.info("[Forwarder.Profile] %s", self.imp)


def main(argv: list[str] | None = None) -> None:
    """Entry point: build both TUN devices, say ``ready``, forward."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    for side in ("a", "b"):
        parser.add_argument(f"--ns-{side}", required=True, help="netns path, /run/netns/NAME")
        parser.add_argument(f"--dev-{side}", required=True, help="TUN device name in that netns")
    parser.add_argument("--profile", required=True, help="LinkProfile.to_dict() as JSON")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
    fd_a = open_tun_in_netns(args.ns_a, args.dev_a)
    fd_b = open_tun_in_netns(args.ns_b, args.dev_b)
    fwd = Forwarder(fd_a, fd_b, Impairment.from_profile(json.loads(args.profile)), args.seed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
    except PermissionError:
        logger.warning("[Forwarder.Priority] no real-time priority here: a busy host may starve it")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    fwd.run(sys.stdin.fileno())


if __name__ == "__main__":
    main()

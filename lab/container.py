"""Shaping inside a container (the compose simulation): ``tc netem`` on the container's own link.

A container has one interface towards the coordinator, so its egress gets one direction of
the profile directly, and its ingress the other through an ``ifb`` device. Where ``ifb`` is
missing, the whole round trip is put on egress (RTT and rate upstream stay right).
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import replace

from skyfed.lab.profiles import LinkProfile
from skyfed.lab.shapers import netem_commands

logger = logging.getLogger(__name__)

IFB = "ifb0"


def ingress_redirect_commands(dev: str, ifb: str = IFB) -> list[list[str]]:
    """Commands that send ``dev``'s ingress through ``ifb``'s egress, where it can be shaped."""
    return [
        ["ip", "link", "add", ifb, "type", "ifb"],
        ["ip", "link", "set", "dev", ifb, "up"],
        ["tc", "qdisc", "add", "dev", dev, "handle", "ffff:", "ingress"],
        ["tc", "filter", "add", "dev", dev, "parent", "ffff:", "matchall"]
        + ["action", "mirred", "egress", "redirect", "dev", ifb],
    ]


def shape_container_link(dev: str, profile: LinkProfile) -> str:
    """Shape both directions of ``dev``; returns how (``egress+ifb`` or ``egress-only``)."""
    try:
        for argv in ingress_redirect_commands(dev):
            _run(argv)
    except subprocess.CalledProcessError as exc:
        logger.warning("[Lab.Container] no ifb (%s): full round trip on egress of %s", exc, dev)
        one_way = replace(profile, rtt_ms=2 * profile.rtt_ms)
        for argv in netem_commands(dev, one_way):
            _run(argv)
        return "egress-only"
    for target in (dev, IFB):
        for argv in netem_commands(target, profile):
            _run(argv)
    return "egress+ifb"


def _run(argv: list[str]) -> None:
    logger.info("[Lab.Container] %s", " ".join(argv))
    subprocess.run(argv, check=True, capture_output=True, text=True)

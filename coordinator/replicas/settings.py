"""The replica options of ``coordinator serve``, checked (their fields are in
``coordinator/config.py``); no etcd client is imported here."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from skyfed.certs.identity import COORDINATOR_NAME, NAME_PATTERN, replica_name
from skyfed.validate import require

if TYPE_CHECKING:
    from skyfed.coordinator.config import CoordinatorConfig

MIN_LEASE_TTL_S = 2
"""etcd grants no lease shorter than about 2 s with its default timing."""


def parse_endpoints(text: str) -> list[str]:
    """``http://a:2379,https://b:2379`` as a list; a ValueError names a bad one."""
    endpoints = [e.strip() for e in text.split(",") if e.strip()]
    for url in endpoints:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
            raise ValueError(f"etcd endpoint {url!r} must be http(s)://HOST:PORT")
    if not endpoints:
        raise ValueError("no etcd endpoint given")
    return endpoints


def check_replica_options(config: CoordinatorConfig) -> None:
    """``replica`` and ``etcd`` come together; each value is usable."""
    if not config.replica and not config.etcd:
        return
    require("coordinator", bool(config.replica), "replica", config.replica, "set with etcd")
    require(
        "coordinator",
        NAME_PATTERN.fullmatch(config.replica) is not None,
        "replica",
        config.replica,
        "1-63 characters of [a-z0-9._-] starting with a letter or digit",
    )
    require("coordinator", bool(config.etcd), "etcd", config.etcd, "set with replica")
    try:
        parse_endpoints(config.etcd)
    except ValueError as exc:
        raise ValueError(f"coordinator option etcd={config.etcd!r}: {exc}") from None
    https = any(url.startswith("https://") for url in parse_endpoints(config.etcd))
    require(
        "coordinator",
        not https or config.etcd_ca is not None,
        "etcd_ca",
        None,
        "set for https etcd endpoints",
    )
    wait = config.replica_ack_timeout_s
    require("coordinator", wait > 0, "replica_ack_timeout_s", wait, "> 0")
    ttl = config.lease_ttl_s
    require("coordinator", ttl >= MIN_LEASE_TTL_S, "lease_ttl_s", ttl, f">= {MIN_LEASE_TTL_S}")
    port = config.advertise.rpartition(":")[2]
    require(
        "coordinator",
        not config.advertise or (port.isdigit() and 0 < int(port) < 65536),
        "advertise",
        config.advertise,
        "HOST:PORT",
    )
    require(
        "coordinator",
        bool(config.etcd_prefix.strip("/")),
        "etcd_prefix",
        config.etcd_prefix,
        "not empty",
    )


def certificate_stem(replica: str) -> str:
    """The stem of a replica's certificate files in a ``certs`` directory
    (``certs issue coordinator --replica NAME`` writes them)."""
    return replica_name(replica) if replica else COORDINATOR_NAME

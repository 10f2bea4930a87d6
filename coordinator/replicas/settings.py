"""The replica options of ``coordinator serve`` (its ``[replicas]`` section), checked; no
etcd client is imported here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from skyfed.certs.identity import COORDINATOR_NAME, NAME_PATTERN, replica_name
from skyfed.config.checks import ConfigError, check_types, require

COMPONENT, SECTION = "coordinator", "replicas"

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


@dataclass(kw_only=True, slots=True)
class ReplicasConfig:
    """The coordinator's replicas, which elect one leader through etcd (docs/failover.md).
    TOML: ``[replicas]``."""

    replica: str = ""
    """This replica's name among the coordinator's replicas ("": one coordinator, no
    election). With ``etcd`` it campaigns for leadership; while another replica leads it
    serves as a standby, which answers agents with the leader's address. Its certificate
    in ``certs`` is ``coordinator-<replica>.crt`` (``certs issue coordinator --replica``)."""
    etcd: str = ""
    """The etcd cluster the replicas elect their leader through: comma-separated
    ``http(s)://HOST:PORT`` endpoints. Over https a replica shows etcd its own certificate
    (etcd trusts the federation's ``ca.crt``: ``--client-cert-auth``) and checks etcd's
    against ``etcd_ca``."""
    etcd_ca: Path | None = None
    """The CA etcd's server certificate chains to (https endpoints). Not the federation's
    CA by default: a certificate from it that a server may show is a coordinator's, and
    etcd is not one (docs/failover.md)."""
    advertise: str = ""
    """HOST:PORT agents dial to reach this replica, which standbys name to them ("": the
    ``listen`` address with its bound port)."""
    lease_ttl_s: int = 5
    """TTL of a replica's etcd lease, in seconds. A leader that cannot refresh its lease
    stops acting before it lapses; a standby leads once it has (a killed leader is
    replaced within about this long)."""
    etcd_prefix: str = "skyfed"
    """This federation's keys in etcd: one etcd may serve several federations."""
    replica_ack_timeout_s: float = 10.0
    """How long a leader waits for a following standby to hold a round before agents get
    its end; one that takes longer is marked behind and does not campaign until it has
    caught up (docs/failover.md)."""

    def __post_init__(self) -> None:
        check_types(self, COMPONENT, SECTION)
        if self.replica or self.etcd:
            self._check()

    def _check(self) -> None:
        """``replica`` and ``etcd`` come together; each value is usable."""
        _require(bool(self.replica), "replica", self.replica, "set with etcd")
        ok = NAME_PATTERN.fullmatch(self.replica) is not None
        what = "1-63 characters of [a-z0-9._-] starting with a letter or digit"
        _require(ok, "replica", self.replica, what)
        _require(bool(self.etcd), "etcd", self.etcd, "set with replica")
        try:
            endpoints = parse_endpoints(self.etcd)
        except ValueError as exc:
            error = ConfigError(COMPONENT, "etcd", self.etcd, "", section=SECTION, reason=str(exc))
            raise error from None
        https = any(url.startswith("https://") for url in endpoints)
        _require(not https or self.etcd_ca is not None, "etcd_ca", None, "set for https etcd")
        wait = self.replica_ack_timeout_s
        _require(wait > 0, "replica_ack_timeout_s", wait, "> 0")
        ttl = self.lease_ttl_s
        _require(ttl >= MIN_LEASE_TTL_S, "lease_ttl_s", ttl, f">= {MIN_LEASE_TTL_S}")
        port = self.advertise.rpartition(":")[2]
        ok = not self.advertise or (port.isdigit() and 0 < int(port) < 65536)
        _require(ok, "advertise", self.advertise, "HOST:PORT")
        _require(bool(self.etcd_prefix.strip("/")), "etcd_prefix", self.etcd_prefix, "not empty")


def _require(ok: bool, key: str, value: object, what: str) -> None:
    require(COMPONENT, ok, key, value, what, section=SECTION)


def certificate_stem(replica: str) -> str:
    """The stem of a replica's certificate files in a ``certs`` directory
    (``certs issue coordinator --replica NAME`` writes them)."""
    return replica_name(replica) if replica else COORDINATOR_NAME

"""A throwaway federation (CA, coordinator, agents) for the local demo and for tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .authority import CertificateAuthority

DEFAULT_AGENTS: tuple[tuple[str, str], ...] = (
    ("aws", "aws-1"),
    ("gcp", "gcp-1"),
    ("azure", "azure-1"),
)


ADMIN_NAME = "ops"
"""The operator identity :func:`make_federation` issues, for admin calls."""


def make_federation(
    directory: Path,
    clouds: Sequence[tuple[str, str]] = DEFAULT_AGENTS,
    trust_domain: str = "skyfed.local",
) -> CertificateAuthority:
    """Init a CA in ``directory``, issue ``coordinator`` (localhost, 127.0.0.1) and the
    ``(cloud, name)`` agents and the operator ``ops`` (admin). Files are ``<name>.crt`` / ``<name>.key`` next to ``ca.crt``."""
    ca = CertificateAuthority.init(Path(directory), trust_domain)
    ca.issue_coordinator("coordinator", hosts=("localhost", "127.0.0.1"))
    ca.issue_admin(ADMIN_NAME)
    for cloud, name in clouds:
        ca.issue_agent(cloud, name)
    return ca

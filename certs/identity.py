"""SPIFFE identities: who a certificate says its holder is, and the rules for names."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cryptography import x509
from cryptography.x509.oid import ExtensionOID

SCHEME = "spiffe://"
ROLES = ("agent", "coordinator", "admin")
# The coordinator's name: its files (coordinator.crt, .key) and the downlink's rounding
# seed are keyed by it, so no agent or operator may take it.
COORDINATOR_NAME = "coordinator"
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
REPLICA_PREFIX = f"{COORDINATOR_NAME}-"
"""A coordinator replica's name is ``coordinator-<replica>`` (docs/failover.md): reserved,
like ``coordinator``, for the coordinator role."""
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_MAX_DNS_NAME = 253


class IdentityError(ValueError):
    """A name, trust domain, URI or certificate that is not a valid skyfed identity."""


def replica_name(replica: str) -> str:
    """The identity name of coordinator replica ``replica``: ``coordinator-<replica>``."""
    return REPLICA_PREFIX + replica


def is_dns_name(text: str) -> bool:
    """True for a lowercase DNS name such as ``skyfed.local`` (no trailing dot, no wildcard)."""
    labels = text.split(".")
    return len(text) <= _MAX_DNS_NAME and all(_DNS_LABEL.fullmatch(x) for x in labels)


def validate_trust_domain(trust_domain: str) -> str:
    """Return ``trust_domain`` if it is a lowercase DNS-like name, else raise IdentityError."""
    if not isinstance(trust_domain, str) or not is_dns_name(trust_domain):
        raise IdentityError(
            f"invalid trust_domain {trust_domain!r}: expected a lowercase DNS-like name "
            "such as 'skyfed.local'"
        )
    return trust_domain


def validate_name(field: str, value: str) -> str:
    """Return ``value`` if it is a valid name or cloud, else raise IdentityError naming field."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise IdentityError(
            f"invalid {field} {value!r}: expected 1-63 characters of [a-z0-9._-] "
            "starting with a letter or digit"
        )
    return value


@dataclass(frozen=True, slots=True)
class Identity:
    """A federation member, as named by the SPIFFE URI in its certificate."""

    trust_domain: str
    """The federation's trust domain, e.g. ``skyfed.local``."""
    role: str
    """``"agent"``, ``"coordinator"``, or ``"admin"`` (an operator: may call admin RPCs)."""
    name: str
    """Unique within the federation; also the stem of the member's cert and key files."""
    cloud: str | None = None
    """The agent's cloud (``aws``, ``gcp``, ...); required for agents, absent otherwise."""

    def __post_init__(self) -> None:
        validate_trust_domain(self.trust_domain)
        if self.role not in ROLES:
            raise IdentityError(f"invalid role {self.role!r}: expected one of {ROLES}")
        validate_name("name", self.name)
        if self.role != "coordinator" and (
            self.name == COORDINATOR_NAME or self.name.startswith(REPLICA_PREFIX)
        ):
            raise IdentityError(
                f"invalid name {self.name!r}: reserved for the coordinator; pick another"
            )
        if self.role == "agent":
            if self.cloud is None:
                raise IdentityError(f"invalid cloud None: agent {self.name!r} needs a cloud")
            validate_name("cloud", self.cloud)
        elif self.cloud is not None:
            raise IdentityError(f"invalid cloud {self.cloud!r}: only agents have a cloud")

    @classmethod
    def agent(cls, trust_domain: str, cloud: str, name: str) -> Identity:
        return cls(trust_domain=trust_domain, role="agent", name=name, cloud=cloud)

    @classmethod
    def coordinator(cls, trust_domain: str, name: str = "coordinator") -> Identity:
        return cls(trust_domain=trust_domain, role="coordinator", name=name)

    @classmethod
    def admin(cls, trust_domain: str, name: str) -> Identity:
        return cls(trust_domain=trust_domain, role="admin", name=name)

    @property
    def uri(self) -> str:
        if self.role == "agent":
            return f"{SCHEME}{self.trust_domain}/cloud/{self.cloud}/agent/{self.name}"
        return f"{SCHEME}{self.trust_domain}/{self.role}/{self.name}"

    @classmethod
    def parse(cls, uri: str) -> Identity:
        """The identity named by ``uri``; IdentityError for any other URI."""
        if not isinstance(uri, str) or not uri.startswith(SCHEME):
            raise IdentityError(f"invalid SPIFFE URI {uri!r}: expected {SCHEME}<trust-domain>/...")
        trust_domain, _, path = uri[len(SCHEME) :].partition("/")
        parts = path.split("/")
        try:
            if len(parts) == 4 and parts[0] == "cloud" and parts[2] == "agent":
                return cls.agent(trust_domain, cloud=parts[1], name=parts[3])
            if len(parts) == 2 and parts[0] == "coordinator":
                return cls.coordinator(trust_domain, name=parts[1])
            if len(parts) == 2 and parts[0] == "admin":
                return cls.admin(trust_domain, name=parts[1])
        except IdentityError as e:
            raise IdentityError(f"invalid SPIFFE URI {uri!r}: {e}") from None
        raise IdentityError(
            f"invalid SPIFFE URI {uri!r}: expected {SCHEME}<td>/cloud/<cloud>/agent/<name> "
            f", {SCHEME}<td>/coordinator/<name> or {SCHEME}<td>/admin/<name>"
        )

    def __str__(self) -> str:
        return self.uri


def spiffe_uris(cert: x509.Certificate) -> list[str]:
    """Every ``spiffe://`` URI in the certificate's subject alternative name."""
    try:
        san = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME)
    except x509.ExtensionNotFound:
        return []
    names = san.value
    assert isinstance(names, x509.SubjectAlternativeName)
    uris = names.get_values_for_type(x509.UniformResourceIdentifier)
    return [u for u in uris if u.lower().startswith(SCHEME)]


def identity_of_certificate(cert: x509.Certificate) -> Identity:
    """The identity in ``cert``'s SAN, which must hold exactly one ``spiffe://`` URI."""
    uris = spiffe_uris(cert)
    if len(uris) != 1:
        raise IdentityError(
            f"certificate serial 0x{cert.serial_number:x} has {len(uris)} spiffe:// URIs "
            "in its subject alternative name; expected exactly one"
        )
    return Identity.parse(uris[0])


def trust_domain_of_ca(cert: x509.Certificate) -> str:
    """The trust domain a federation CA names in its SAN (``spiffe://<trust-domain>``)."""
    uris = spiffe_uris(cert)
    if len(uris) != 1:
        raise IdentityError("the CA certificate names no spiffe://<trust-domain> URI")
    return validate_trust_domain(uris[0][len(SCHEME) :].rstrip("/"))

"""One identity's certificate files as a Kubernetes Secret manifest (never the CA's key)."""

from __future__ import annotations

import base64
from typing import Any

from .authority import CertificateAuthority

SECRET_PREFIX = "skyfed-certs-"
CA_KEY = "ca.key"


def secret_manifest(
    ca: CertificateAuthority,
    name: str,
    *more: str,
    secret_name: str | None = None,
    namespace: str,
) -> dict[str, Any]:
    """A ``v1/Secret`` holding what ``name`` needs mounted as its ``--certs`` directory.

    An agent gets ``ca.crt`` and its own ``<name>.crt``/``.key``; the coordinator also
    ``crl.pem``, which it re-reads when ``certs revoke`` and a re-applied Secret change
    it. ``ca.key`` signs every identity of the federation, so it stays where ``certs init``
    put it (docs/deployment.md). ``more`` names: one Secret for the pods of one
    StatefulSet, each of which reads its own files (the coordinator's replicas,
    docs/failover.md); it needs ``secret_name``.
    """
    if more and secret_name is None:
        raise ValueError("a Secret of several identities needs --secret-name")
    files = {"ca.crt": ca.ca_cert_path}
    for each in (name, *more):
        issued = ca.get(each)
        files[issued.cert_path.name] = issued.cert_path
        files[issued.key_path.name] = issued.key_path
        if issued.identity.role == "coordinator":
            files["crl.pem"] = ca.crl_path
    assert CA_KEY not in files  # the invariant this module exists for
    labels = {"app.kubernetes.io/part-of": "skyfed"}
    if not more:
        labels["skyfed.io/identity"] = name
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": secret_name or SECRET_PREFIX + name,
            "namespace": namespace,
            "labels": labels,
        },
        "data": {key: base64.b64encode(path.read_bytes()).decode() for key, path in files.items()},
    }

"""One identity's certificate files as a Kubernetes Secret manifest (never the CA's key)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from .authority import CertificateAuthority
from .bundle import identity_files

SECRET_PREFIX = "skyfed-certs-"


def secret_manifest(
    ca: CertificateAuthority,
    name: str,
    *more: str,
    secret_name: str | None = None,
    namespace: str,
) -> dict[str, Any]:
    """A ``v1/Secret`` holding what ``name`` needs mounted as its ``--certs`` directory
    (``certs/bundle.py``: never ``ca.key``); the coordinator re-reads its ``crl.pem`` when
    ``certs revoke`` and a re-applied Secret change it (docs/deployment.md). ``more``
    names: one Secret for the pods of one StatefulSet, each of which reads its own files
    (the coordinator's replicas, docs/failover.md); it needs ``secret_name``.
    """
    if more and secret_name is None:
        raise ValueError("a Secret of several identities needs --secret-name")
    files: dict[str, Path] = {}
    for each in (name, *more):
        files |= identity_files(ca, each)
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

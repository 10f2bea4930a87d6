"""One identity's certificate files as a Kubernetes Secret manifest (never the CA's key)."""

from __future__ import annotations

import base64
from typing import Any

from .authority import CertificateAuthority
from .bundle import identity_files

SECRET_PREFIX = "skyfed-certs-"


def secret_manifest(
    ca: CertificateAuthority, name: str, *, secret_name: str | None = None, namespace: str
) -> dict[str, Any]:
    """A ``v1/Secret`` holding what ``name`` needs mounted as its ``--certs`` directory
    (``certs/bundle.py``): the coordinator re-reads its ``crl.pem`` when ``certs revoke``
    and a re-applied Secret change it (docs/deployment.md).
    """
    files = identity_files(ca, name)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": secret_name or SECRET_PREFIX + name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/part-of": "skyfed",
                "skyfed.io/identity": name,
            },
        },
        "data": {key: base64.b64encode(path.read_bytes()).decode() for key, path in files.items()},
    }

"""What one identity needs as its ``--certs`` directory, and never more: ``ca.crt``, its
own certificate and key and, for the coordinator, ``crl.pem``. ``ca.key`` signs every
identity of the federation, so it stays where ``certs init`` put it (docs/security.md).
"""

from __future__ import annotations

from pathlib import Path

from skyfed.files import PUBLIC_MODE, write_atomic

from .authority import CA_KEY, CertificateAuthority
from .files import DIRECTORY_MODE, write_private


def identity_files(ca: CertificateAuthority, name: str) -> dict[str, Path]:
    """``{file name: path in the CA's directory}`` of what ``name`` mounts as ``--certs``."""
    issued = ca.get(name)
    files = {
        "ca.crt": ca.ca_cert_path,
        issued.cert_path.name: issued.cert_path,
        issued.key_path.name: issued.key_path,
    }
    if issued.identity.role == "coordinator":
        files["crl.pem"] = ca.crl_path
    assert CA_KEY not in files  # the invariant this module exists for
    return files


def write_bundle(ca: CertificateAuthority, name: str, out: Path) -> list[Path]:
    """Copy ``name``'s files into ``out`` (made 0700 if new): its key 0600, the rest 0644."""
    out.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
    issued = ca.get(name)
    written = []
    for file_name, source in identity_files(ca, name).items():
        target = out / file_name
        if source == issued.key_path:
            write_private(target, source.read_bytes())
        else:
            write_atomic(target, source.read_bytes(), mode=PUBLIC_MODE)
        written.append(target)
    return written

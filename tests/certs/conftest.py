"""Fixtures for the certificate tool's tests: a fresh CA in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyfed.certs.authority import CertificateAuthority


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.init(tmp_path / "pki", "skyfed.local")


@pytest.fixture
def other_ca(tmp_path: Path) -> CertificateAuthority:
    """A second federation's CA, same trust domain: a look-alike that must not be trusted."""
    return CertificateAuthority.init(tmp_path / "other", "skyfed.local")

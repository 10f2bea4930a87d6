"""`certs k8s-secret`: an identity's files as the Secret the manifests mount, never ca.key."""

from __future__ import annotations

import base64
import json
import subprocess

import kubernetes_validate
import pytest
from click.testing import CliRunner

from skyfed.certs.cli import cli

from .test_k8s_manifests import KUBERNETES_VERSION, OVERLAYS, of_kind, pod_spec


def secret(pki, name: str, *extra: str) -> dict:
    result = CliRunner().invoke(cli, ["k8s-secret", name, "--dir", str(pki.directory), *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_agent_secret_holds_its_certificate_key_and_the_ca_certificate_only(pki):
    manifest = secret(pki, "aws-1")
    files = {k: base64.b64decode(v) for k, v in manifest["data"].items()}
    assert set(files) == {"ca.crt", "aws-1.crt", "aws-1.key"}
    for name, data in files.items():
        assert data == (pki.directory / name).read_bytes(), name
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_coordinator_secret_adds_the_crl_and_never_the_ca_key(pki):
    manifest = secret(pki, "coordinator", "--namespace", "fed")
    assert set(manifest["data"]) == {"ca.crt", "coordinator.crt", "coordinator.key", "crl.pem"}
    assert manifest["metadata"]["namespace"] == "fed"
    ca_key = (pki.directory / "ca.key").read_bytes()
    assert base64.b64encode(ca_key).decode() not in json.dumps(manifest)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secret_names_are_the_ones_the_manifests_mount(pki, overlay):
    """`certs k8s-secret NAME` with no options makes the Secret each pod mounts."""
    for workload in [*of_kind(overlay, "Job"), *of_kind(overlay, "StatefulSet")]:
        (certs,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == "certs"]
        wanted = certs["secret"]["secretName"]
        identity = wanted.removeprefix("skyfed-certs-")  # the pki fixture issued each
        assert secret(pki, identity)["metadata"]["name"] == wanted


def test_an_identity_never_issued_is_a_one_line_error(pki):
    out = subprocess.run(
        ["certs", "k8s-secret", "nobody", "--dir", str(pki.directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert (
        out.stderr.strip() == f"Error: no certificate named 'nobody' was issued in {pki.directory}"
    )
    assert out.stdout == ""

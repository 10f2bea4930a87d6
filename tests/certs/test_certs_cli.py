"""The `certs` command as people use it: real console script once, CliRunner for the rest."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from skyfed.certs.authority import CertificateAuthority
from skyfed.certs.cli import cli


def _certs(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["certs", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_cli_issue_then_show_prints_spiffe_identity(tmp_path: Path) -> None:
    env = {"SKYFED_CERTS_DIR": str(tmp_path / "pki")}
    assert _certs("init", env=env).returncode == 0
    issued = _certs("issue", "agent", "--cloud", "aws", "--name", "aws-1", env=env)
    assert issued.returncode == 0, issued.stderr
    shown = _certs("show", str(tmp_path / "pki" / "aws-1.crt"))
    assert shown.returncode == 0, shown.stderr
    assert "spiffe://skyfed.local/cloud/aws/agent/aws-1" in shown.stdout
    assert "fingerprint sha256" in shown.stdout


def test_cli_error_is_one_line_with_exit_status_2(tmp_path: Path) -> None:
    result = _certs("revoke", "aws-1", "--dir", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "certs init" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_dir_defaults_to_certs_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SKYFED_CERTS_DIR", raising=False)
    assert _run("init")[0] == 0
    assert (tmp_path / "certs" / "ca.crt").is_file()


def test_cli_init_twice_without_force_fails_cleanly(tmp_path: Path) -> None:
    assert _run("init", "--dir", str(tmp_path))[0] == 0
    code, output = _run("init", "--dir", str(tmp_path))
    assert code == 2
    assert "already exists" in output
    assert _run("init", "--dir", str(tmp_path), "--force")[0] == 0


def test_cli_issue_coordinator_with_hosts_shows_them_in_json(tmp_path: Path) -> None:
    CertificateAuthority.init(tmp_path)
    code, _ = _run("issue", "coordinator", "--dir", str(tmp_path), "--host", "coord.example.com")
    assert code == 0
    code, output = _run("show", "--json", str(tmp_path / "coordinator.crt"))
    fields = json.loads(output)
    assert fields["spiffe_id"] == "spiffe://skyfed.local/coordinator/coordinator"
    assert fields["san"] == [
        "URI:spiffe://skyfed.local/coordinator/coordinator",
        "DNS:coord.example.com",
    ]
    assert set(fields) >= {"subject", "serial", "not_before", "not_after", "issuer"}


def test_cli_revoke_then_list_and_show_crl_report_it(tmp_path: Path) -> None:
    ca = CertificateAuthority.init(tmp_path)
    issued = ca.issue_agent("aws", "aws-1")
    ca.issue_agent("gcp", "gcp-1")
    code, output = _run("revoke", "aws-1", "--dir", str(tmp_path))
    assert code == 0
    assert f"0x{issued.serial:x}" in output
    rows = json.loads(_run("list", "--json", "--dir", str(tmp_path))[1])
    assert {r["name"]: r["revoked"] for r in rows} == {"aws-1": True, "gcp-1": False}
    table = _run("list", "--dir", str(tmp_path))[1].splitlines()
    assert table[0].split()[:3] == ["NAME", "ROLE", "CLOUD"]
    crl = json.loads(_run("show", "--json", str(ca.crl_path))[1])
    assert [e["serial"] for e in crl["revoked"]] == [f"0x{issued.serial:x}"]


@pytest.mark.parametrize(
    "args",
    [
        ["issue", "agent", "--cloud", "AWS", "--name", "x"],
        ["issue", "coordinator", "--host", "bad host"],
        ["revoke", "nobody"],
    ],
)
def test_cli_bad_input_exits_2_with_a_message(tmp_path: Path, args: list[str]) -> None:
    CertificateAuthority.init(tmp_path)
    code, output = _run(*args, "--dir", str(tmp_path))
    assert code == 2
    assert output.startswith("Error: ")


def test_cli_show_of_a_file_that_is_not_a_certificate_exits_2(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    code, output = _run("show", str(junk))
    assert code == 2
    assert "neither a certificate nor a CRL" in output


def test_cli_bundle_copies_what_one_identity_mounts_and_never_the_ca_key(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    ca.issue_agent("aws", "aws-1")
    ca.issue_coordinator()
    for name, files in {
        "aws-1": {"ca.crt", "aws-1.crt", "aws-1.key"},
        "coordinator": {"ca.crt", "coordinator.crt", "coordinator.key", "crl.pem"},
    }.items():
        out = tmp_path / "bundles" / name
        code, output = _run("bundle", name, "--dir", str(ca.directory), "--out", str(out))
        assert code == 0, output
        assert {p.name for p in out.iterdir()} == files
        modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
        assert modes.pop(f"{name}.key") == 0o600
        assert set(modes.values()) == {0o644}
        assert (out / f"{name}.crt").read_bytes() == (ca.directory / f"{name}.crt").read_bytes()
    code, output = _run("bundle", "nobody", "--dir", str(ca.directory), "--out", str(tmp_path))
    assert code == 2 and "no certificate named 'nobody'" in output

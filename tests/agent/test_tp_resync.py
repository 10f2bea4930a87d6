"""A tp=2 site that joins late loads the federation's weights into its shards and keeps up."""

from __future__ import annotations

import json

import pytest

from skyfed.procs import command

pytestmark = pytest.mark.multiprocess


def agent_argv(port: int, certs, cloud: str, *extra: str) -> list[str]:
    return command(
        "agent", "start", "--cloud", cloud, "--coordinator", f"localhost:{port}",
        "--certs", str(certs), "--local-steps", "1", "--device", "cpu", *extra,
    )  # fmt: skip


def test_tp2_site_joining_late_resyncs_and_applies_rounds_bit_identical(
    serve, reaped, pki, tmp_path
):
    running = serve(min_agents=1, quorum=1, codec="fp16")
    reaped.start("gcp", agent_argv(running.port, pki.directory, "gcp"))
    report = tmp_path / "aws.json"
    argv = agent_argv(
        running.port, pki.directory, "aws", "--tp", "2", "--rounds", "3", "--report", str(report)
    )
    aws = reaped.start("aws", argv)
    assert aws.wait(timeout=120) == 0, reaped.log("aws")[-3000:]
    log = reaped.log("aws")
    assert "weights of round" in log, "aws joined behind, so the weights must have followed"
    assert "[Agent.Resync]" not in log, "every round's digest must have matched"
    assert json.loads(report.read_text())["rounds_applied"] == 3

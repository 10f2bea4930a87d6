"""A site launched by torchrun (one process per rank) joins a federation and ends identical."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ..e2e.test_federation_processes import report, start_agent, start_coordinator

pytestmark = pytest.mark.multiprocess

ROUNDS = 3


def test_torchrun_site_of_two_ranks_trains_beside_a_plain_agent_and_ends_identical(
    reaped, pki, tmp_path: Path
):
    work = tmp_path
    port = start_coordinator(reaped, work, rounds=ROUNDS, **{"--min-agents": 2})
    start_agent(reaped, work, port, "aws", 0)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    argv += ["-m", "skyfed.agent", "start", "--cloud=gcp", f"--coordinator=localhost:{port}"]
    argv += [f"--certs={work / 'certs'}", "--shard=1", "--num-shards=3", "--local-steps=1"]
    reaped.start("gcp", [*argv, f"--report={work / 'gcp.json'}"])
    for name in ("coordinator", "aws", "gcp"):
        code = reaped.procs[name].wait(timeout=240)
        assert code == 0, f"{name} exited {code}:\n{reaped.log(name)[-3000:]}"
    assert "torchrun rank=0/2 local=0 device=cpu" in reaped.log("gcp"), reaped.log("gcp")[-3000:]
    status = json.loads((work / "status.json").read_text())
    for cloud in ("aws", "gcp"):
        assert report(work, cloud)["round"] == ROUNDS - 1, (cloud, report(work, cloud))
        assert report(work, cloud)["weights_digest"] == status["weightsDigest"], cloud

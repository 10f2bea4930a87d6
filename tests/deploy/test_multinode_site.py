"""A site over two "nodes": two torchrun launchers on this host meet through a c10d
rendezvous on loopback and form one 2 x 2 site, whose rank 0 alone holds the session."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ..e2e.test_federation_processes import report, start_coordinator
from .slurm_cluster import free_port

pytestmark = pytest.mark.multiprocess

ROUNDS = 3
TASK = "skyfed.tasks.examples:mlp_task"


def launcher(port: int, work: Path, rendezvous: int) -> list[str]:
    """One node's torchrun: two local ranks of a four-rank site."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2"]
    argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{rendezvous}", "--rdzv-id=gcp"]
    argv += ["-m", "skyfed.agent", "start", "--cloud=gcp", f"--coordinator=localhost:{port}"]
    argv += [f"--certs={work / 'certs'}", f"--task={TASK}", "--local-steps=2", "--tp=2"]
    argv += ["--device=cpu", "--dp-mode=fsdp", f"--report={work / 'gcp.json'}"]
    return [*argv, "--metrics-listen=127.0.0.1:0"]  # each node's first rank serves probes


def test_two_launchers_on_loopback_form_one_2x2_site(reaped, pki, tmp_path: Path):
    work = tmp_path
    port = start_coordinator(
        reaped, work, rounds=ROUNDS, **{"--min-agents": 1, "--task": TASK, "--codec": "fp16"}
    )
    rendezvous = free_port()
    # Ranks on two "nodes" (LOCAL_WORLD_SIZE < WORLD_SIZE) do not assume loopback: the
    # operator names the interface Gloo uses, as on a real cluster.
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    for node in ("a", "b"):
        reaped.start(f"node-{node}", launcher(port, work, rendezvous), env=env)
    for name in ("node-a", "node-b", "coordinator"):
        code = reaped.procs[name].wait(timeout=240)
        assert code == 0, f"{name} exited {code}:\n{reaped.log(name)[-3000:]}"
    logs = reaped.log("node-a") + reaped.log("node-b")
    assert "torchrun rank=0/4" in logs, logs[-3000:]
    assert logs.count("[Agent.Join]") == 1, "only rank 0 holds the session"
    assert "dp=2 tp=2" in reaped.log("coordinator")
    status = json.loads((work / "status.json").read_text())
    assert report(work, "gcp")["round"] == ROUNDS - 1
    assert report(work, "gcp")["weights_digest"] == status["weightsDigest"]

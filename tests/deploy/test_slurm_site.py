"""A site submitted with sbatch to a real Slurm joins a federation and ends identical: the
script's GPU form as shipped, one task per (Slurm-scheduled) GPU, bound to it and to a core."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..e2e.test_federation_processes import report, start_agent, start_coordinator
from .slurm_cluster import SlurmCluster, free_port

pytestmark = pytest.mark.multiprocess

SBATCH = Path(__file__).parents[2] / "deploy" / "slurm" / "agent.sbatch"
ROUNDS = 4


def test_sbatch_site_of_two_gpu_tasks_trains_beside_a_plain_agent_and_ends_identical(
    slurm: SlurmCluster, reaped, pki, tmp_path: Path
):
    work = tmp_path
    port = start_coordinator(reaped, work, rounds=ROUNDS, **{"--min-agents": 2})
    start_agent(reaped, work, port, "aws", 0)
    job_log = work / "gcp-job.out"
    # The script as shipped, its resources sized to the test node (2 GPUs, 2 cores);
    # `agent` comes from this interpreter's bin.
    job = slurm.sbatch(
        "--ntasks-per-node=2",
        "--gpus-per-node=2",
        "--cpus-per-gpu=1",
        f"--output={job_log}",
        f"--chdir={work}",
        str(SBATCH),
        f"localhost:{port}",
        str(work / "certs"),
        "gcp",
        "--shard=1",
        "--num-shards=3",
        "--local-steps=1",
        f"--report={work / 'gcp.json'}",
        env={
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "MASTER_PORT": str(free_port()),
        },
    )
    out = job_log.read_text(errors="replace") if job_log.exists() else ""
    assert job.returncode == 0, f"sbatch: {job.stderr}\njob output:\n{out[-4000:]}\n{slurm.logs()}"
    for name in ("coordinator", "aws"):
        code = reaped.procs[name].wait(timeout=120)
        assert code == 0, f"{name} exited {code}:\n{reaped.log(name)[-3000:]}"
    # Two Slurm tasks made one site of two data-parallel replicas, ranks from SLURM_PROCID,
    # host from the node list; rank 0 saw only its own GPU and was bound to one core.
    assert f"slurm rank=0/2 local=0 device=cpu rendezvous={slurm.node}:" in out, out[-3000:]
    assert re.search(r"dp=2 tp=1 cuda_visible=0 cpus=\d+\n", out), out[-3000:]
    status = json.loads((work / "status.json").read_text())
    for cloud in ("aws", "gcp"):
        assert report(work, cloud)["round"] == ROUNDS - 1, (cloud, report(work, cloud))
        assert report(work, cloud)["weights_digest"] == status["weightsDigest"], cloud


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["localhost:7443", "/nonexistent"], "usage: sbatch"),
        (["localhost:7443", "/nonexistent", "hpc"], "cannot read /nonexistent/ca.crt"),
    ],
)
def test_agent_sbatch_refuses_missing_parameters_before_starting_any_task(args, message):
    out = subprocess.run(
        ["bash", str(SBATCH), *args], capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode == 2 and message in out.stderr, out

"""Check the agent's CUDA/NCCL path on a machine with one NVIDIA GPU; prints PASS/FAIL.

    python scripts/gpu_check.py          # CUDA + NCCL (one GPU is enough)
    python scripts/gpu_check.py --cpu    # the same checks on CPU + Gloo, anywhere

With one GPU, NCCL cannot put two ranks on one device, so the TP code path runs on a
mesh of one rank (``device=cuda`` always takes the rank-process path: an NCCL group for
the mesh, a Gloo group for the control plane). With two or more GPUs the federation
check also runs ``tp=2`` on NCCL. Checks:

1. environment: CUDA device, NCCL available.
2. tp-path: in this process, an NCCL group of size 1 on cuda:0, the task sharded by its
   plan on a 1-rank mesh; against a CPU replica: the same initial digest, a pseudo-gradient
   within float tolerance, and bit-identical weights after applying one update.
3. federation: a coordinator on loopback (throwaway CA), agent aws on cuda and agent gcp
   on CPU, fp16 codec (lossy, with error feedback), 4 rounds: both end on the
   coordinator's digest with no resync.

Finishes in about a minute; exits 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from skyfed.agent.ranks import STORE_HOST, init_ranks
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalTrainer
from skyfed.certs.testing import make_federation
from skyfed.compression import make_codec
from skyfed.coordinator.aggregate import RoundAggregate
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.server import run_server
from skyfed.procs import children, command
from skyfed.tasks import load_task

TASK = "chargpt"
ROUNDS = 4
FED_TIMEOUT_S = 150


class CheckFailed(Exception):
    pass


def require(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


def check_environment(device: str) -> str:
    if device == "cpu":
        return f"torch {torch.__version__}, CPU + Gloo (--cpu)"
    require(torch.cuda.is_available(), "torch.cuda.is_available() is False")
    require(dist.is_nccl_available(), "this torch build has no NCCL")
    name = torch.cuda.get_device_name(0)
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return f"torch {torch.__version__}, {torch.cuda.device_count()} x {name}, NCCL {nccl}"


def logical_delta(site: Site) -> list[torch.Tensor]:
    """The site's pseudo-gradient as the coordinator assembles it (coverage checked)."""
    contribution = (aggregate := RoundAggregate(site.spec)).begin(1)
    for p in site.contribution(0, "fp32"):
        contribution.stage(contribution.check(p))
    contribution.commit()
    return aggregate.mean()


def check_tp_path(device: str) -> str:
    store = dist.TCPStore(STORE_HOST, 0, is_master=True, wait_for_workers=False)
    group, mesh, dev = init_ranks(0, 1, device, store)
    try:
        options = {"seed": 0, "shard": 0, "num_shards": 1, "local_steps": 2}
        site = Site(LocalTrainer(load_task(TASK), mesh=mesh, device=dev, **options), group)
        replica = Site(LocalTrainer(load_task(TASK), **options))
        require(site.digest() == replica.digest(), "initial weights differ from the CPU's")
        site.train(), replica.train()
        ours, theirs = logical_delta(site), logical_delta(replica)
        num = sum(float((a - b).double().norm() ** 2) for a, b in zip(ours, theirs, strict=True))
        den = sum(float(b.double().norm() ** 2) for b in theirs)
        rel = (num / den) ** 0.5
        require(rel < 1e-2, f"pseudo-gradient differs from the CPU's by {rel:.2e} (relative)")
        datas = [make_codec("fp32").encode(d) for d in theirs]
        site.apply(0, datas), replica.apply(0, datas)
        require(site.digest() == replica.digest(), "one applied update: weights not bit-identical")
        placed = {str(p.device) for p in site.trainer.params}
        return (
            f"{dist.get_backend()} group of 1 on {placed}; delta rel. diff {rel:.1e}; apply exact"
        )
    finally:
        dist.destroy_process_group()


def start_agent(kids, work: Path, port: int, cloud: str, shard: int, device: str, tp: int) -> None:
    flags = {
        "--cloud": cloud,
        "--coordinator": f"localhost:{port}",
        "--certs": work / "certs",
        "--shard": shard,
        "--num-shards": 2,
        "--local-steps": 2,
        "--device": device,
        "--tp": tp,
        "--report": work / f"{cloud}.json",
    }
    kids.start(cloud, command("agent", "start", *(str(x) for kv in flags.items() for x in kv)))


def check_federation(device: str) -> str:
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    tp = 2 if device == "cpu" or gpus >= 2 else 1
    with tempfile.TemporaryDirectory() as tmp, children(Path(tmp) / "logs") as kids:
        work = Path(tmp)
        pki = make_federation(work / "certs")
        config = CoordinatorConfig(
            listen="127.0.0.1:0", certs=pki.directory, codec="fp16", rounds=ROUNDS,
            min_agents=2, quorum=2, task=TASK,
        )  # fmt: skip
        with run_server(config) as running:
            start_agent(kids, work, running.port, "aws", 0, device, tp)
            start_agent(kids, work, running.port, "gcp", 1, "cpu", 1)
            for cloud in ("aws", "gcp"):
                code = kids.procs[cloud].wait(timeout=FED_TIMEOUT_S)
                require(code == 0, f"agent {cloud} exited {code}:\n{kids.log(cloud)[-2000:]}")
            digest = running.federation.model.weights_digest
        for cloud in ("aws", "gcp"):
            report = json.loads((work / f"{cloud}.json").read_text())
            require(report["round"] == ROUNDS - 1, f"{cloud} ended at round {report['round']}")
            require(report["weights_digest"] == digest, f"{cloud}'s weights differ")
            require("[Agent.Resync]" not in kids.log(cloud), f"{cloud} had to resync")
        return f"aws {device} tp={tp} + gcp cpu, {ROUNDS} fp16 rounds, both on digest {digest[:12]}"


def run(name: str, check: Callable[[str], str], device: str) -> bool:
    started = time.monotonic()
    try:
        detail, ok = check(device), True
    except CheckFailed as exc:
        detail, ok = str(exc), False
    except Exception:  # a crash is a failed check, with its traceback for the report
        detail, ok = traceback.format_exc(), False
    word = "PASS" if ok else "FAIL"
    print(f"{word} {name:<12} {time.monotonic() - started:6.1f}s  {detail}", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="check CPU + Gloo instead of CUDA")
    device = "cpu" if parser.parse_args().cpu else "cuda"
    checks = [
        ("environment", check_environment),
        ("tp-path", check_tp_path),
        ("federation", check_federation),
    ]
    results = []
    for name, check in checks:
        results.append(run(name, check, device))
        if name == "environment" and not results[-1]:
            break
    passed = sum(results)
    verdict = "PASS" if passed == len(checks) else "FAIL"
    print(f"SUMMARY: {verdict} ({passed}/{len(checks)} checks, device={device})")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

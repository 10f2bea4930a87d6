"""Check the agent's CUDA/NCCL path and GPU telemetry on an NVIDIA machine; prints PASS/FAIL.

    python scripts/gpu_check.py          # CUDA + NCCL (one GPU is enough; more run dp x tp)
    python scripts/gpu_check.py --cpu    # the same checks on CPU + Gloo, anywhere

With one GPU, NCCL cannot put two ranks on one device, so the site's code path runs on a
mesh of one rank (``device=cuda`` always takes the rank-process path: an NCCL group for
the mesh, a Gloo group for the control plane); dp x tp layouts need a GPU per rank. Checks:

1. environment: CUDA device, NCCL available.
2. nvml: each GPU read through NVML (nvidia-ml-py) as the agent reads it: utilisation,
   memory, temperature, power. With ``--cpu``: a CPU site has no GPU telemetry and says
   why, without an error.
3. tp-path: in this process, an NCCL group of size 1 on cuda:0, the task sharded by its
   plan on a 1-rank mesh; against a CPU replica: the same initial digest, a pseudo-gradient
   within float tolerance, and bit-identical weights after applying one update.
4. layouts: the largest of 2 x 2, 2 x 1 (FSDP2 and DDP) and 1 x 2 that has a GPU per
   rank (on CPU: all four), one process per rank on NCCL; against a CPU replica as in 2.
   One GPU: nothing to run (a PASS that says so).
5. federation: a coordinator on loopback (throwaway CA), agent aws on cuda with as many
   ranks as GPUs (up to 2 x 2; on CPU 2 x 2) and agent gcp on CPU, fp16 codec (lossy, with
   error feedback), 4 rounds: both end on the coordinator's digest with no resync.

Finishes in a few minutes; exits 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from skyfed.agent.gpus import GpuWatch
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
FED_TIMEOUT_S = 240
LAYOUT_TIMEOUT_S = 300


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


def check_nvml(device: str) -> str:
    """Every GPU read as a rank of a site reads its own (``skyfed.agent.gpus``)."""
    if device == "cpu":
        watch = GpuWatch(torch.device("cpu"), rank=0)
        require(not watch.active and watch.last is None, "a CPU site must have no GPU readings")
        return f"no GPU telemetry, as expected: {watch.why_not}"
    seen = []
    for index in range(torch.cuda.device_count()):
        watch = GpuWatch(torch.device("cuda", index), rank=index)
        require(watch.active, f"cuda:{index}: {watch.why_not}")
        got = watch.read()
        require(got is not None, f"cuda:{index}: NVML read failed: {watch.why_not}")
        assert got is not None
        require(0 <= got.utilization <= 1, f"cuda:{index}: utilisation {got.utilization}")
        require(0 < got.memory_used_bytes <= got.memory_total_bytes, f"cuda:{index}: memory")
        require(0 < got.temperature_c < 120, f"cuda:{index}: temperature {got.temperature_c}")
        require(0 < got.power_w < 2000, f"cuda:{index}: power {got.power_w} W")
        seen.append(
            f"GPU {got.index} {got.name}: {got.utilization:.0%} busy, "
            f"{got.memory_used_bytes / 2**30:.1f}/{got.memory_total_bytes / 2**30:.0f} GiB, "
            f"{got.temperature_c:.0f} C, {got.power_w:.0f} W"
        )
    return "; ".join(seen)


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
        compared = compare(site, replica)
        placed = {str(p.device) for p in site.trainer.params}
        return f"{dist.get_backend()} group of 1 on {placed}; {compared}"
    finally:
        dist.destroy_process_group()


def layouts_for(device: str) -> list[tuple[int, int, str]]:
    """(dp, tp, dp_mode) to check: on CUDA the largest that have a GPU per rank; on CPU one
    of each data-parallel path (FSDP2 x TP, FSDP2's replicate x TP, torch's DDP)."""
    every = [(2, 2, "fsdp"), (2, 2, "ddp"), (2, 1, "fsdp"), (2, 1, "ddp"), (1, 2, "auto")]
    if device == "cpu":
        return [(2, 2, "fsdp"), (2, 2, "ddp"), (2, 1, "ddp")]
    gpus = torch.cuda.device_count()
    fits = [layout for layout in every if layout[0] * layout[1] <= gpus]
    return [layout for layout in fits if layout[0] * layout[1] == fits[0][0] * fits[0][1]]


def layout_rank(rank: int, dp: int, tp: int, mode: str, device: str, port: int, out: Any) -> None:
    """One rank of a dp x tp site; rank 0 checks it against a 1 x 1 CPU replica."""
    torch.set_num_threads(1)
    store = dist.TCPStore(STORE_HOST, port, is_master=False)
    group, mesh, dev = init_ranks(rank, dp * tp, device, store, dp=dp)
    options = {"seed": 0, "shard": 0, "num_shards": 1, "local_steps": 2}
    trainer = LocalTrainer(load_task(TASK), mesh=mesh, device=dev, dp_mode=mode, **options)
    site = Site(trainer, group)
    try:
        if rank == 0:
            replica = Site(LocalTrainer(load_task(TASK), **options))
            out.put(compare(site, replica) + f" ({trainer.dp_mode})")
            site.stop()
        else:
            site.follow()
    finally:
        dist.destroy_process_group()


def compare(site: Site, replica: Site) -> str:
    """Digest, pseudo-gradient and one applied update of ``site`` against ``replica``."""
    require(site.digest() == replica.digest(), "initial weights differ from the replica's")
    site.train(), replica.train()
    ours, theirs = logical_delta(site), logical_delta(replica)
    num = sum(float((a - b).double().norm() ** 2) for a, b in zip(ours, theirs, strict=True))
    den = sum(float(b.double().norm() ** 2) for b in theirs)
    rel = (num / den) ** 0.5
    require(rel < 1e-2, f"pseudo-gradient differs from the replica's by {rel:.2e} (relative)")
    datas = [make_codec("fp32").encode(d) for d in theirs]
    site.apply(0, datas), replica.apply(0, datas)
    require(site.digest() == replica.digest(), "one applied update: weights not bit-identical")
    return f"delta rel. diff {rel:.1e}; apply exact"


def check_layouts(device: str) -> str:
    layouts = layouts_for(device)
    if not layouts:
        return "one GPU: no dp x tp layout to run (the mesh of one is tp-path's)"
    seen = []
    for dp, tp, mode in layouts:
        store = dist.TCPStore(STORE_HOST, 0, is_master=True, wait_for_workers=False)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        args = (dp, tp, mode, device, store.port, out)
        procs = [ctx.Process(target=layout_rank, args=(r, *args)) for r in range(dp * tp)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(LAYOUT_TIMEOUT_S)
        codes = [p.exitcode for p in procs]
        require(codes == [0] * len(procs), f"{dp}x{tp} {mode}: ranks exited {codes}")
        seen.append(f"{dp}x{tp} {out.get(timeout=5)}")
    backend = "NCCL" if device == "cuda" else "Gloo"
    return f"{backend}: " + "; ".join(seen)


def start_agent(
    kids, work: Path, port: int, cloud: str, shard: int, device: str, layout: tuple[int, int]
) -> None:
    flags = {
        "--cloud": cloud,
        "--coordinator": f"localhost:{port}",
        "--certs": work / "certs",
        "--shard": shard,
        "--num-shards": 2,
        "--local-steps": 2,
        "--device": device,
        "--dp": layout[0],
        "--tp": layout[1],
        "--report": work / f"{cloud}.json",
    }
    kids.start(cloud, command("agent", "start", *(str(x) for kv in flags.items() for x in kv)))


def check_federation(device: str) -> str:
    gpus = torch.cuda.device_count() if device == "cuda" else 4
    layout = (2, 2) if gpus >= 4 else (1, 2) if gpus >= 2 else (1, 1)
    with tempfile.TemporaryDirectory() as tmp, children(Path(tmp) / "logs") as kids:
        work = Path(tmp)
        pki = make_federation(work / "certs")
        config = CoordinatorConfig.from_flat(
            listen="127.0.0.1:0", certs=pki.directory, codec="fp16", rounds=ROUNDS,
            min_agents=2, quorum=2, task=TASK,
        )  # fmt: skip
        with run_server(config) as running:
            start_agent(kids, work, running.port, "aws", 0, device, layout)
            start_agent(kids, work, running.port, "gcp", 1, "cpu", (1, 1))
            for cloud in ("aws", "gcp"):
                code = kids.procs[cloud].wait(timeout=FED_TIMEOUT_S)
                require(code == 0, f"agent {cloud} exited {code}:\n{kids.log(cloud)[-2000:]}")
            digest = running.federation.model.weights_digest
        for cloud in ("aws", "gcp"):
            report = json.loads((work / f"{cloud}.json").read_text())
            require(report["round"] == ROUNDS - 1, f"{cloud} ended at round {report['round']}")
            require(report["weights_digest"] == digest, f"{cloud}'s weights differ")
            require("[Agent.Resync]" not in kids.log(cloud), f"{cloud} had to resync")
        return (
            f"aws {device} {layout[0]}x{layout[1]} + gcp cpu 1x1, {ROUNDS} fp16 rounds, both on "
            f"digest {digest[:12]}"
        )


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
        ("nvml", check_nvml),
        ("tp-path", check_tp_path),
        ("layouts", check_layouts),
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

"""Sites of each layout on CPU (Gloo): throughput, uplink bytes, memory per rank, and fp32
parity with a 1 x 1 site; DDP and FSDP2 side by side.

    python bench/sites.py                          # 10M `wide` task, 1x1 2x1 1x2 2x2, 3 repeats
    python bench/sites.py --params 1M --repeats 1  # quicker
    python bench/sites.py --record                 # and keep the run in bench/results/

Each layout runs the product's own ``Site`` and ``LocalTrainer`` in ``dp x tp`` rank
processes (a 1 x 1 site in one process with no mesh, as ``agent start`` runs it), rank 0
driving the others as the agent's daemon does. Per round: ``local_steps`` optimizer steps
(every replica on its slice of each batch), the contribution (every rank encodes its own
slices) and the apply of an aggregate.

- ``parity``: round 0 sends fp32; its pseudo-gradient, assembled in logical coordinates,
  against the 1 x 1 site's: the largest difference in each tensor over that tensor's
  float32 rounding unit (``eps x max |w|``, its largest weight's spacing), the largest over
  the tensors. Since ``delta = start - end``, that is how far apart the two sites' weights
  end, in the weights' own rounding.
- ``samples/s``: the rounds after a warm-up one are timed: the site's batch x local steps
  over the local phase's wall time; median of the rounds, then median over the repeats,
  with their range.
- ``up B/round``: the WAN bytes of one fp16 contribution.
- ``RSS/model``: each rank's peak resident memory over the timed rounds (``VmHWM``, reset
  after the warm-up round) less its memory before it built the model, over the model's
  fp32 bytes: the smallest and the largest rank (rank 0 also holds the gathered uplink and
  the aggregate), median over the repeats.

Each rank has one torch thread and the agent's allocator settings (``fix_mmap_threshold``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import record  # noqa: E402

from skyfed.agent.parallelize import narrow  # noqa: E402
from skyfed.agent.ranks import STORE_HOST, init_ranks  # noqa: E402
from skyfed.agent.site import Site  # noqa: E402
from skyfed.agent.trainer import LocalTrainer  # noqa: E402
from skyfed.allocator import fix_mmap_threshold  # noqa: E402
from skyfed.compression import decode_payload, make_codec  # noqa: E402
from skyfed.tasks import load_task  # noqa: E402
from skyfed.wire import Payload, shard_shape  # noqa: E402

LAYOUTS = ((1, 1), (2, 1), (1, 2), (2, 2))
MODES = ("ddp", "fsdp")
WARMUP_ROUNDS = 1


@dataclass(frozen=True, slots=True)
class Run:
    """One layout's run, as rank 0 and every rank saw it."""

    samples_per_s: float
    up_bytes: int
    rss_over_model: tuple[float, float]
    """The smallest and the largest rank's."""
    parity: float
    """In the weights' rounding units (:func:`rounding_units`)."""


def rss_bytes() -> int:
    """This process's resident memory now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's peak resident memory since the last :func:`reset_peak` (VmHWM)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024  # kB


def reset_peak() -> None:
    """Start VmHWM again from the resident memory now (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_after_warmup(site: Site) -> None:
    """Every rank resets its peak as its local phase after the warm-up rounds begins (the
    ranks run their local phases in lockstep)."""
    train, calls = site.trainer.train, [0]

    def counted() -> Any:
        calls[0] += 1
        if calls[0] == 2 + WARMUP_ROUNDS:  # round 0 (parity), then the warm-up rounds
            reset_peak()
        return train()

    site.trainer.train = counted  # type: ignore[method-assign]


def logical(site: Site, payloads: list[Payload]) -> list[torch.Tensor]:
    """The contribution in logical coordinates: each slice decoded into its place."""
    out = [torch.zeros(info.shape) for info in site.spec]
    for p in payloads:
        part = decode_payload(p.data, shape=shard_shape(site.spec[p.tensor].shape, p.shard))
        narrow(out[p.tensor], p.shard).copy_(part)
    return out


EPS = torch.finfo(torch.float32).eps


def rounding_units(
    delta: list[torch.Tensor], want: list[torch.Tensor], weights: list[torch.Tensor]
) -> float:
    """The largest difference of ``delta`` from ``want`` in each tensor, over that tensor's
    rounding unit ``eps x max |w|``; the largest over the tensors."""
    return max(
        float((d - w).abs().max()) / (EPS * float(x.abs().max()))
        for d, w, x in zip(delta, want, weights, strict=True)
    )


def parity_round(site: Site, ref: Path, weights: list[torch.Tensor]) -> float:
    """Round 0 in fp32: the pseudo-gradient against the 1 x 1 site's (which the 1 x 1 run
    leaves in ``ref``), in the weights' rounding units; the update applied."""
    site.train()
    delta = logical(site, site.contribution(0, "fp32"))
    if not ref.exists():
        torch.save(delta, ref)
    parity = rounding_units(delta, torch.load(ref, weights_only=True), weights)
    site.apply(0, [make_codec("fp32").encode(d) for d in delta])
    return parity


def drive(site: Site, a: Any) -> dict[str, Any]:
    """Rank 0: round 0 for parity, then warm-up and ``a.rounds`` timed rounds in fp16."""
    weights = [p.detach() for p in load_task(a.task).build_model(0).parameters()]
    parity = parity_round(site, Path(a.ref), weights)
    del weights
    fp16 = make_codec("fp16")
    zeros = [fp16.encode(torch.zeros(info.shape)) for info in site.spec]
    train_s, up = [], []
    for r in range(1, WARMUP_ROUNDS + a.rounds + 1):
        started = time.perf_counter()
        site.train()
        train_s.append(time.perf_counter() - started)
        up.append(sum(len(p.data) for p in site.contribution(r, "fp16")))
        site.acked(r)
        site.apply(r, zeros)
    site.digest()
    timed = train_s[WARMUP_ROUNDS:]
    return {
        "samples_per_s": site.trainer.task.batch_size() * a.local_steps / statistics.median(timed),
        "up_bytes": int(statistics.median(up)),
        "parity": parity,
    }


def rank_main(rank: int, world: int, dp: int, mode: str, port: int, a: Any, out: Any) -> None:
    torch.set_num_threads(1)
    fix_mmap_threshold()
    task = load_task(a.task)
    options = {"seed": 0, "shard": 0, "num_shards": 1, "local_steps": a.local_steps}
    if world == 1:
        before = rss_bytes()
        site = Site(LocalTrainer(task, **options))
    else:
        store = dist.TCPStore(STORE_HOST, port, is_master=False)
        group, mesh, device = init_ranks(rank, world, "cpu", store, dp=dp)
        before = rss_bytes()
        trainer = LocalTrainer(task, mesh=mesh, device=device, dp_mode=mode, **options)
        site = Site(trainer, group)
    peak_after_warmup(site)
    seen = None
    if rank == 0:
        seen = drive(site, a)
        if world > 1:
            site.stop()
    else:
        site.follow()
    out.put((rank, peak_rss_bytes() - before, seen))
    if world > 1:
        dist.destroy_process_group()


def run(dp: int, tp: int, mode: str, args: Any) -> Run:
    world = dp * tp
    store = dist.TCPStore(STORE_HOST, 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=rank_main, args=(r, world, dp, mode, store.port, args, out))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    heard = [out.get(timeout=1800) for _ in range(world)]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a rank of {dp}x{tp} {mode} exited {p.exitcode}")
    lead = next(seen for _, _, seen in heard if seen is not None)
    model_bytes = sum(p.numel() * 4 for p in load_task(args.task).build_model(0).parameters())
    grown = [g / model_bytes for _, g, _ in heard]
    return Run(lead["samples_per_s"], lead["up_bytes"], (min(grown), max(grown)), lead["parity"])


def spread(values: list[float], digits: int) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def table(rows: dict[tuple[int, int, str], list[Run]]) -> list[str]:
    lines = [
        "| layout | dp mode | samples/s | up B/round (fp16) | RSS/model, ranks' least-most "
        "| fp32 parity vs 1x1 (eps x max abs w) |",
        "|---|---|---|---|---|---|",
    ]
    med = statistics.median
    for (dp, tp, mode), runs in rows.items():
        least, most = med(r.rss_over_model[0] for r in runs), med(r.rss_over_model[1] for r in runs)
        lines.append(
            f"| {dp}x{tp} | {mode} | {spread([r.samples_per_s for r in runs], 1)} "
            f"| {int(med(r.up_bytes for r in runs)):,} | {least:.2f}-{most:.2f} "
            f"| {max(r.parity for r in runs):.1f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default="10M", help="the wide task's size")
    parser.add_argument("--local-steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after round 0")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--record", action="store_true", help="keep the run in bench/results/")
    args = parser.parse_args(argv)
    # batch 8 splits over dp=2; width even so TP splits it and FSDP splits each TP slice.
    args.task = f"skyfed.tasks.examples:wide?params={args.params}&batch=8"
    configs = [(dp, tp, "none" if dp == 1 else mode) for dp, tp in LAYOUTS for mode in MODES]
    configs = list(dict.fromkeys(configs))  # a 1 x T layout has no dp mode: once
    rows: dict[tuple[int, int, str], list[Run]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            args.ref = str(Path(tmp) / f"ref-{repeat}.pt")
            for dp, tp, mode in configs:
                rows[(dp, tp, mode)].append(run(dp, tp, mode, args))
                print(f"repeat {repeat + 1}: {dp}x{tp} {mode}: {rows[(dp, tp, mode)][-1]}")
    head = (
        f"task `{args.task}`, {args.local_steps} local steps per round, {args.rounds} timed "
        f"rounds, {args.repeats} repeats (median, range), 1 torch thread per rank, "
        f"{os.cpu_count()} CPUs"
    )
    lines = [head, "", *table(rows)]
    print("\n".join(lines))
    if args.record:
        print(record("sites", "layouts-cpu", sys.argv[1:], lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

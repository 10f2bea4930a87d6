"""Local tensor parallelism benchmark: per-step cost of tp=1 vs tp=2, and per-rank codec time.

    python bench/tp.py                       # default task, fp16 and topk, 6 steps each
    python bench/tp.py --steps 3 --codecs fp16

Part 1 runs the real ``Site`` (rank processes on Gloo for tp=2) with one local step per
round, so a round is a step: ``train`` is forward/backward/optimizer, ``encode`` the
slowest rank's error-feedback encode of its own shards, ``contrib`` the whole
contribution step on rank 0 (encode + gather of payloads), ``apply`` decoding the
aggregate and subtracting each rank's slice, ``digest`` the all-gather of weights and the
hash. ``up B/step`` is what one step puts on the WAN. Times are medians, in ms.

Part 2 times one rank's encode (with error feedback) of a shard of a 4M-element tensor as
``tp`` grows: each rank encodes 1/tp of it, in parallel with the others.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from skyfed.agent.ranks import STORE_HOST, Ranks, init_ranks
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalTrainer
from skyfed.compression import ErrorFeedback, make_codec
from skyfed.tasks import load_task

WARMUP = 2
SCALING_NUMEL = 4 << 20


@dataclass(frozen=True, slots=True)
class StepRow:
    tp: int
    codec: str
    train_ms: float
    encode_ms: float
    contrib_ms: float
    apply_ms: float
    digest_ms: float
    up_bytes: int
    raw_bytes: int


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - start) * 1e3


def timing_encodes(site: Site) -> list[float]:
    """Wrap this rank's uplink encode so every call's duration (ms) is recorded."""
    times: list[float] = []
    encode = site.uplink.encode

    def wrapper(*args: Any) -> Any:
        out, ms = timed(lambda: encode(*args))
        times.append(ms)
        return out

    site.uplink.encode = wrapper  # type: ignore[method-assign]
    return times


def drive(site: Site, codec: str, steps: int) -> dict[str, list[float]]:
    """Rank 0: ``steps`` rounds of train, contribute, apply the mean, digest."""
    times: dict[str, list[float]] = {k: [] for k in ("train", "contrib", "apply", "digest")}
    up = []
    down = make_codec(codec)
    for step in range(WARMUP + steps):
        _, train_ms = timed(site.train)
        payloads, contrib_ms = timed(lambda step=step: site.contribution(step, codec))
        update = [torch.zeros(t.shape) for t in site.spec]
        datas = [down.encode(u) for u in update]
        _, apply_ms = timed(lambda step=step, d=datas: site.apply(step, d))
        _, digest_ms = timed(site.digest)
        if step >= WARMUP:
            for key, ms in zip(times, (train_ms, contrib_ms, apply_ms, digest_ms), strict=True):
                times[key].append(ms)
            up.append(sum(len(p.data) for p in payloads))
    times["up"] = up
    return times


def build_site(task: str, mesh: Any = None, group: Ranks | None = None) -> Site:
    trainer = LocalTrainer(load_task(task), seed=0, shard=0, num_shards=1, local_steps=1, mesh=mesh)
    return Site(trainer, group)


def rank_worker(rank: int, tp: int, port: int, task: str, codec: str, steps: int, out: Any) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore(STORE_HOST, port, is_master=False)
    group, mesh, _ = init_ranks(rank, tp, "cpu", store)
    site = build_site(task, mesh, group)
    encodes = timing_encodes(site)
    if rank == 0:
        times = drive(site, codec, steps)
        site.stop()
        out.put(("lead", times))
    else:
        site.follow()
    out.put(("encode", encodes[WARMUP:]))
    dist.destroy_process_group()


def measure(task: str, tp: int, codec: str, steps: int) -> StepRow:
    if tp == 1:
        torch.set_num_threads(1)
        site = build_site(task)
        encodes = timing_encodes(site)
        times, per_rank = drive(site, codec, steps), [encodes[WARMUP:]]
    else:
        times, per_rank = run_ranks(task, tp, codec, steps)
    slowest = [max(ms) for ms in zip(*per_rank, strict=True)]
    raw = sum(p.numel() * 4 for p in load_task(task).build_model(0).parameters())
    med = statistics.median
    return StepRow(
        tp,
        codec,
        med(times["train"]),
        med(slowest),
        med(times["contrib"]),
        med(times["apply"]),
        med(times["digest"]),
        int(med(times["up"])),
        raw,
    )


def run_ranks(task: str, tp: int, codec: str, steps: int) -> tuple[dict, list[list[float]]]:
    store = dist.TCPStore(STORE_HOST, 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    args = (tp, store.port, task, codec, steps, out)
    procs = [ctx.Process(target=rank_worker, args=(r, *args)) for r in range(tp)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in range(tp + 1)]
    for p in procs:
        p.join()
    times = next(v for k, v in results if k == "lead")
    return times, [v for k, v in results if k == "encode"]


def scaling(codec: str, tp: int, repeats: int = 5) -> tuple[int, float, int]:
    """(shard numel, best encode ms, payload bytes) for one rank's 1/tp of the tensor."""
    torch.manual_seed(0)
    numel = SCALING_NUMEL // tp
    g = torch.randn(numel // 1024, 1024)  # (rows, cols): a row shard
    feedback, c = ErrorFeedback(), make_codec(codec)
    best, size = float("inf"), 0
    for _ in range(repeats):
        (data, _), ms = timed(lambda: feedback.encode("w", c, g))
        best, size = min(best, ms), len(data)
    return numel, best, size


def print_steps(rows: list[StepRow]) -> None:
    print(
        "| tp | codec | train ms/step | encode ms (slowest rank) | contrib ms | apply ms "
        "| digest ms | up B/step | raw B/step |"
    )
    print("|---" * 9 + "|")
    for r in rows:
        print(
            f"| {r.tp} | {r.codec} | {r.train_ms:.1f} | {r.encode_ms:.2f} | {r.contrib_ms:.2f} "
            f"| {r.apply_ms:.2f} | {r.digest_ms:.2f} | {r.up_bytes:,} | {r.raw_bytes:,} |"
        )


def print_scaling(codecs: list[str], tps: list[int]) -> None:
    print(f"\nper-rank encode of a {SCALING_NUMEL / 2**20:.0f}M-element tensor's shard")
    print("| codec | tp | shard elements | encode ms | Melem/s | payload B |")
    print("|---|---|---|---|---|---|")
    for codec in codecs:
        for tp in tps:
            numel, ms, size = scaling(codec, tp)
            print(f"| {codec} | {tp} | {numel:,} | {ms:.2f} | {numel / ms / 1e3:.0f} | {size:,} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="chargpt")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--codecs", default="fp16,topk")
    parser.add_argument("--tps", default="1,2")
    args = parser.parse_args()
    codecs, tps = args.codecs.split(","), [int(t) for t in args.tps.split(",")]
    torch.set_num_threads(1)
    print(f"task={args.task} steps={args.steps} (median after {WARMUP} warm-up), 1 thread/rank")
    print_steps([measure(args.task, tp, c, args.steps) for c in codecs for tp in tps])
    print_scaling(codecs, [1, 2, 4, 8])


if __name__ == "__main__":
    main()

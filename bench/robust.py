"""What bounding one agent's pull costs and buys: weighted mean vs norm clipping.

    python bench/robust.py --rounds 50 --seeds 0,1 --jobs 2

The embedded task on ``--sites`` simulated sites, FP32 both ways, ``delta`` exchange
(``bench/convergence.py``'s ``Site``). Each round the coordinator combines the sites'
deltas as ``coordinator/inbound.py`` does: each weighted by ``min(samples,
max_samples)``, and with ``--clip`` each scaled to at most ``clip_norm_ratio`` x the
median of the recent accepted norms (``coordinator/robust.py``'s ``NormBound``, the same
code). ``attack`` makes site 0 claim ``samples = 2^24`` and send its delta x ``--scale``
every round. The table gives the held-out loss after the last round.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from convergence import Site  # noqa: E402

from skyfed.coordinator.robust import NormBound  # noqa: E402
from skyfed.tasks import load_task  # noqa: E402

HONEST_SAMPLES = 64  # 4 local steps x batch 16
ATTACK_SAMPLES = 1 << 24
MAX_SAMPLES = 64


def train(seed: int, rounds: int, sites: int, clip: float, attack: bool, scale: float) -> float:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    task = load_task("chargpt")
    model = task.build_model(seed)
    group = [Site(task, model, shard, sites, seed, 0.0) for shard in range(sites)]
    bound = NormBound(clip)
    params = dict(model.named_parameters())
    for _ in range(rounds):
        total, weight = None, 0
        for i, site in enumerate(group):
            delta = site.delta(4)
            samples = HONEST_SAMPLES
            if attack and i == 0:
                delta = {k: v * scale for k, v in delta.items()}
                samples = ATTACK_SAMPLES
            w = min(samples, MAX_SAMPLES)
            norm = math.sqrt(sum(float(v.double().square().sum()) for v in delta.values()))
            factor = bound.factor(norm)
            bound.record(norm * factor)
            part = {k: v * (w * factor) for k, v in delta.items()}
            total = part if total is None else {k: total[k] + part[k] for k in total}
            weight += w
        with torch.no_grad():
            for name, u in total.items():
                params[name].sub_(u / weight)
        if not all(bool(torch.isfinite(p).all()) for p in params.values()):
            return math.inf
    return task.eval_loss(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--sites", type=int, default=3)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--clip", type=float, default=4.0, help="clip_norm_ratio of --clip runs")
    parser.add_argument("--scale", type=float, default=50.0, help="the attacker's delta factor")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {
        "mean": (0.0, False),
        f"clip {args.clip:g}": (args.clip, False),
        "mean, attack": (0.0, True),
        f"clip {args.clip:g}, attack": (args.clip, True),
    }
    print(f"chargpt, {args.sites} sites, {args.rounds} rounds, 4 local AdamW steps, fp32")
    print(f"attack: site 0 claims samples=2^24 (capped to {MAX_SAMPLES}), delta x {args.scale:g}")
    print(f"{'aggregate':<22}{'loss':>9}{'vs mean':>10}   per seed")
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {
            (label, s): pool.submit(train, s, args.rounds, args.sites, clip, attack, args.scale)
            for label, (clip, attack) in runs.items()
            for s in seeds
        }
        reference = [futures["mean", s].result() for s in seeds]
        for label in runs:
            losses = [futures[label, s].result() for s in seeds]
            rel = [a / b - 1 for a, b in zip(losses, reference, strict=True)]
            shown = " ".join(f"{x:.4f}" for x in losses)
            print(
                f"{label:<22}{statistics.fmean(losses):>9.4f}{statistics.fmean(rel):>+10.2%}   {shown}"
            )
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

"""What bounding one agent's pull costs and buys: weighted mean vs norm clipping.

    python bench/robust.py --rounds 50 --seeds 0,1 --jobs 2

The embedded task on ``--sites`` simulated sites (``skyfed/simulate.py``: the agent's own
sites and the coordinator's own round), FP32 both ways, ``delta`` exchange, 4 local AdamW
steps. The round combines the sites' deltas as the coordinator does
(``coordinator/round.py``): each weighted by ``min(samples, max_samples)``, and with
``--clip`` each scaled to at most ``clip_norm_ratio`` x the lower median of the round's
and the recent rounds' accepted norms (``coordinator/robust.py``). ``attack`` makes site 0
claim ``samples = 2^24`` and send its delta x ``--scale`` every round. The table gives the
coordinator's held-out loss after the last round.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from skyfed.agent.trainer import LocalResult
from skyfed.compression import decode_payload, make_codec
from skyfed.coordinator.model import RoundRules
from skyfed.simulate import Diverged, Simulation, Tamper, sharded
from skyfed.wire import Payload

ATTACK_SAMPLES = 1 << 24
MAX_SAMPLES = 64  # 4 local steps x batch 16: every honest site's samples


def attacker(scale: float, shapes: list[tuple[int, ...]]) -> Tamper:
    """Site 0 claims :data:`ATTACK_SAMPLES` and sends its delta x ``scale`` (``shapes``:
    the model's tensors')."""
    fp32 = make_codec("fp32")

    def tamper(
        site: int, result: LocalResult, payloads: list[Payload]
    ) -> tuple[int, list[Payload]]:
        if site != 0:
            return result.samples, payloads
        scaled = [
            dataclasses.replace(
                p, data=bytes(fp32.encode(decode_payload(p.data, shape=shapes[p.tensor]) * scale))
            )
            for p in payloads
        ]
        return ATTACK_SAMPLES, scaled

    return tamper


def train(seed: int, rounds: int, sites: int, clip: float, attack: bool, scale: float) -> float:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rules = RoundRules(max_samples=MAX_SAMPLES, clip_norm_ratio=clip, seed=seed)
    sim = Simulation("chargpt", sharded(sites, local_steps=4), rules, seed=seed)
    if attack:
        sim.tamper = attacker(scale, [t.shape for t in sim.model.spec])
    try:
        for _ in range(rounds):
            sim.round()
    except Diverged:
        return math.inf
    if not all(bool(torch.isfinite(w).all()) for w in sim.model.weights):
        return math.inf
    return sim.evaluate()


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

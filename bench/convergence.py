"""Convergence benchmark: the embedded task trained with each codec, loss relative to FP32.

    python bench/convergence.py                          # default (~5 min on 2 cores)
    python bench/convergence.py --rounds 150 --seeds 0,1,2,3,4 --jobs 2   # the fair run
    python bench/convergence.py --to-target --jobs 2     # bytes to a target loss (bench/targets.py)
    python bench/convergence.py --exchange gradient --sites 2 --rounds 170 --only "fp16,topk 1% +" \\
        --switch fp16:50,topk --switch topk:50,fp16                      # a policy's switches

Every run is the product's own round in one process (``skyfed/simulate.py``): ``--sites``
of the agent's own ``Site`` (site ``i`` on shard ``i`` of the data, as the lab starts
agents), each taking ``--local-steps`` steps of the task's optimizer and sending its
pseudo-gradient through its link's codec with its own error feedback, and the
coordinator's own ``Model`` and ``Round``: the weighted mean, norm clipping
(``clip_norm_ratio`` 4), the outer step (FedAvg at ``--outer-lr``) and the downlink with
the coordinator's error feedback (the heaviest uplink codec, Top-k at the union's
density). Codec parameters are the coordinator's ``[policy]``'s, set per row.
``--exchange gradient`` is the coordinator's ``exchange = "gradient"`` (Deep Gradient
Compression's setting, ``skyfed.agent.momentum``): one batch's gradient a round through
momentum SGD (``--sgd-lr``, momentum 0.9) with DGC's momentum correction and, for Top-k,
momentum factor masking; ``--rounds`` then counts steps, and the policy is the one that
exchange gets (``PolicyConfig.for_gradient_exchange``: EC-SGD clips at 4 RMS, 1 bit is
refused). A run whose sites diverge shows as ``diverged``.

``--switch "fp16:50,topk"`` adds a run whose codec changes at the named rounds (FP16 for
50, then Top-k; repeatable), each codec with the coordinator's ``[policy]`` defaults for
the exchange (Top-k: 5 % under ``delta``, 1 % under ``gradient``), as the link's
``CodecRun`` runs a policy's switches: what they cost in convergence, without the lab's
clock. ``topk~10`` sets ``[policy] topk_warmup_rounds = 10``: Top-k's density warms up
over 10 rounds from round 0 and from each switch to it (one warm-up per schedule).

``--overlap`` adds, for every run, the same run with the coordinator's ``overlap = true``
(docs/wan.md#overlap): each site trains round t+1 from the weights before round t's
aggregate, which it applies after those local steps (one round stale); the row
``<codec> + overlap`` is relative to FP32 without overlap, so it reads as the codec's
cost plus overlap's.

Every codec runs on the same seeds (same initial weights, same batches), so the loss
relative to FP32 is paired per seed; the table gives its mean and spread over seeds. The
loss is the coordinator's held-out evaluation of its weights after the last round.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from results_file import recording  # bench/, beside this script

from skyfed.compression import codec_names
from skyfed.compression.policy import PolicyConfig
from skyfed.coordinator.model import RoundRules
from skyfed.coordinator.outer import OuterSettings
from skyfed.simulate import Diverged, Schedule, Simulation, sharded

OVERLAP = " + overlap"  # a run label's suffix: the same run, one round stale
MOMENTUM = 0.9  # --exchange gradient's SGD momentum, the coordinator's default


@dataclass(frozen=True, slots=True)
class Run:
    label: str
    codec: str = ""  # the codec every link runs ("": a --switch schedule, from the label)
    policy: dict[str, Any] = field(default_factory=dict)  # [policy] settings of the row
    goal: float | None = None  # allowed loss increase over FP32, as a fraction
    warmup: bool = False  # Top-k's density warm-up over --warmup rounds


RUNS = [
    Run("fp32", "fp32"),
    Run("fp16", "fp16", goal=0.005),
    Run("bf16", "bf16"),
    Run("topk 1% + EF", "topk", {"topk_density": 0.01}, goal=0.01),
    Run("topk 5% + EF", "topk", {"topk_density": 0.05}, goal=0.01),
    Run("topk 0.1% + EF + warm-up", "topk", {"topk_density": 0.001}, goal=0.03, warmup=True),
    Run("ecsgd 2-bit + EF", "ecsgd", {"ecsgd_bits": 2}, goal=0.03),
    Run("ecsgd 1-bit + EF", "ecsgd", {"ecsgd_bits": 1}, goal=0.03),
]
"""Every row has error feedback on both ends: the product's codecs have no other way."""


def switching(label: str, gradient: bool) -> tuple[Schedule, PolicyConfig]:
    """A ``--switch`` run: ``"fp16:50,topk:80,fp16"`` is FP16 for rounds 0-49, Top-k for
    the next 80, then FP16, with the coordinator's ``[policy]`` defaults for the exchange;
    ``"fp16:50,topk~10"`` warms Top-k's density up over 10 rounds from each switch to it
    (``topk_warmup_rounds``, one per schedule). Returns every site's codec by round and
    the policy."""
    steps: list[tuple[int, str]] = []  # (first round after this step, codec)
    warmups: set[int] = set()
    parts = label.split(",")
    end = 0
    for i, part in enumerate(parts):
        named, _, rounds = part.partition(":")
        name, _, warmup = named.partition("~")
        if not rounds and i < len(parts) - 1:
            raise ValueError(f"{part!r}: only the last codec may run without a round count")
        if rounds and int(rounds) <= 0:
            raise ValueError(f"{part!r}: a codec runs for at least one round")
        if name not in codec_names():
            raise ValueError(f"{part!r}: no codec {name!r} (one of {', '.join(codec_names())})")
        if warmup and (name != "topk" or int(warmup) <= 0):
            raise ValueError(f"{part!r}: only topk warms up, over at least one round")
        if warmup:
            warmups.add(int(warmup))
        end = end + int(rounds) if rounds else 2**62  # the last step lasts
        steps.append((end, name))
    if len(warmups) > 1:
        raise ValueError(f"{label!r}: one warm-up per schedule (the policy's topk_warmup_rounds)")
    policy = _policy({"topk_warmup_rounds": warmups.pop() if warmups else 0}, gradient)
    return lambda _site, t: next(name for until, name in steps if t < until), policy


def _policy(settings: dict[str, Any], gradient: bool) -> PolicyConfig:
    """The coordinator's ``[policy]`` with ``settings``, for the exchange."""
    policy = PolicyConfig(**settings)
    return policy.for_gradient_exchange() if gradient else policy


@dataclass(frozen=True, slots=True)
class Config:
    rounds: int
    sites: int
    local_steps: int
    warmup_rounds: int
    sgd_lr: float = 0.0  # > 0: the coordinator's exchange = "gradient" at this SGD rate
    outer_lr: float = 1.0  # the coordinator's outer_lr: w -= outer_lr * mean


def simulation(label: str, seed: int, cfg: Config) -> Simulation:
    """The federation a row's label describes, ready to run its rounds."""
    overlap = label.endswith(OVERLAP)
    label = label.removesuffix(OVERLAP)
    gradient = cfg.sgd_lr > 0
    run = next((r for r in RUNS if r.label == label), None)
    if run is None:  # a --switch schedule, even of one codec
        schedule, policy = switching(label, gradient)
    else:
        warmup = {"topk_warmup_rounds": cfg.warmup_rounds} if run.warmup else {}
        schedule, policy = (lambda _s, _t: run.codec), _policy({**run.policy, **warmup}, gradient)
    rules = RoundRules(
        outer=OuterSettings.resolve("sgd", cfg.outer_lr, None), policy=policy, seed=seed
    )
    local_steps = 1 if gradient else cfg.local_steps
    return Simulation(
        "chargpt",
        sharded(cfg.sites, local_steps=local_steps),
        rules,
        seed=seed,
        exchange="gradient" if gradient else "delta",
        sgd_lr=cfg.sgd_lr or 0.1,
        sgd_momentum=MOMENTUM,
        overlap=overlap,
        schedule=schedule,
    )


def train(label: str, seed: int, cfg: Config) -> float:
    """Held-out loss after ``cfg.rounds`` rounds; inf if training diverged."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    sim = simulation(label, seed, cfg)
    try:
        for _ in range(cfg.rounds):
            sim.round()
    except Diverged:
        return math.inf
    return sim.evaluate()


def row(run: Run, losses: list[float], reference: list[float]) -> str:
    """One table line: mean loss, and the paired change vs FP32 as mean ± stdev, min..max."""
    if not all(math.isfinite(loss) for loss in losses):
        diverged = sum(not math.isfinite(loss) for loss in losses)
        verdict = "" if run.goal is None else "FAIL"
        return f"{run.label:<26}{'diverged':>9} on {diverged} of {len(losses)} seeds{verdict:>36}"
    rel = [loss / ref - 1 for loss, ref in zip(losses, reference, strict=True)]
    mean = statistics.fmean(rel)
    spread = statistics.stdev(rel) if len(rel) > 1 else 0.0
    goal = "" if run.goal is None else f"{run.goal:.1%}"
    verdict = "" if run.goal is None else ("PASS" if mean <= run.goal else "FAIL")
    return (
        f"{run.label:<26}{statistics.fmean(losses):>9.4f}{mean:>+9.2%} ±{spread:>6.2%}"
        f"{min(rel):>+9.2%}..{max(rel):>+7.2%}{goal:>7}{verdict:>6}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds",
        "--steps",
        default=None,
        help="exchanges per codec and seed (default 50); --to-target: S, the reference's "
        "steps (default 256), or per task, e.g. chargpt=4096,digits=1024",
    )
    parser.add_argument("--local-steps", type=int, default=4, help="AdamW steps per round")
    parser.add_argument("--exchange", choices=("delta", "gradient"), default="delta")
    parser.add_argument("--sgd-lr", type=float, default=0.1, help="--exchange gradient's rate")
    parser.add_argument(
        "--sites", type=int, default=None, help="simulated agents (default 3; --to-target 2)"
    )
    parser.add_argument(
        "--seeds",
        default=None,
        help="comma-separated; every codec runs each (default 0,1; --to-target 0,1,2,3,4)",
    )
    parser.add_argument("--warmup", type=int, default=None, help="density warm-up rounds")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument("--only", default="", help="comma-separated label prefixes (and fp32)")
    parser.add_argument(
        "--switch",
        action="append",
        default=[],
        metavar="SCHEDULE",
        help='a run whose codec changes, e.g. "fp16:50,topk" (50 rounds fp16, then topk); '
        '"topk~10": with a 10-round density warm-up from the switch',
    )
    parser.add_argument(
        "--overlap", action="store_true", help="also every run one round stale (delta exchange)"
    )
    parser.add_argument(
        "--outer-lr", type=float, default=1.0, help="delta exchange: w -= outer_lr * mean"
    )
    parser.add_argument(
        "--to-target",
        action="store_true",
        help="bytes to per-step FP32 data-parallel's held-out loss, every configuration "
        "(bench/targets.py; --jobs, --steps, --sites, --seeds and the options below apply)",
    )
    parser.add_argument("--quick", action="store_true", help="--to-target's small grid")
    parser.add_argument(
        "--tasks",
        default="chargpt,digits",
        help="--to-target's tasks, comma-separated: chargpt, digits, llama (the Hugging Face "
        "Llama example, the hf extra)",
    )
    parser.add_argument(
        "--configs",
        default="",
        help="--to-target: these configurations instead of the grid, ';'-separated, e.g. "
        '"H=16 sgd topk 1%% 2-bit; H=64 nesterov:lr=0.3,m=0.8 fp16"; "H=128,lr=4.5e-3 ...": '
        "the local steps' own inner AdamW rate (the reference keeps the task's); a codec "
        'ending in " + overlap": the coordinator\'s overlap = true',
    )
    parser.add_argument(
        "--cap",
        type=float,
        default=None,
        help="--to-target: a configuration stops after this many times S (default 1.5)",
    )
    parser.add_argument(
        "--payloads",
        action="store_true",
        help="--to-target: print one contribution's bytes per codec (up, down, framing) "
        "instead of training",
    )
    parser.add_argument(
        "--task-options",
        default="",
        help="--to-target: added to every task's spec, e.g. \"lr=1e-3\" (the inner AdamW's)",
    )
    parser.add_argument(
        "--reference-order",
        choices=("same", "other"),
        default="same",
        help="--to-target: 'other' adds the row per-step FP32 data-parallel, the same initial "
        "weights, the sites' batches drawn in another order (seed + 1000), read against each "
        "seed's targets as the configurations are: how often data-parallel reaches its own "
        "target (default 'same': no row)",
    )
    parser.add_argument(
        "--record", metavar="WHAT", help="also write bench/results/<date>-convergence-WHAT.md"
    )
    args = parser.parse_args()
    with recording("convergence", args.record, sys.argv[1:]):
        run(parser, args)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.to_target or args.quick:
        to_target(parser, args)
        return
    if args.overlap and args.exchange != "delta":
        parser.error("--overlap needs --exchange delta (the agent overlaps local steps)")
    local_steps = args.local_steps
    try:
        rounds = 50 if args.rounds is None else int(args.rounds)
    except ValueError:
        parser.error(f"--rounds {args.rounds!r}: an integer")
    warmup = args.warmup if args.warmup is not None else max(1, rounds // 5)
    sgd_lr = args.sgd_lr if args.exchange == "gradient" else 0.0
    sites = 3 if args.sites is None else args.sites
    cfg = Config(rounds, sites, local_steps, warmup, sgd_lr, args.outer_lr)
    for schedule in args.switch:
        try:
            switching(schedule, gradient=bool(sgd_lr))
        except ValueError as e:
            parser.error(f"--switch {schedule!r}: {e}")
    seeds = [int(s) for s in (args.seeds or "0,1").split(",")]
    picks = [s.strip() for s in args.only.split(",") if s.strip()]
    selected = [
        r for r in RUNS if r.label == "fp32" or not picks or r.label.startswith(tuple(picks))
    ] + [Run(schedule) for schedule in args.switch]
    if sgd_lr:  # the coordinator refuses 1-bit EC-SGD under gradient exchange
        selected = [r for r in selected if r.policy.get("ecsgd_bits") != 1]
    if args.overlap:
        selected += [replace(r, label=r.label + OVERLAP, goal=None) for r in selected]
    mode = f"{local_steps} local AdamW steps per round"
    if sgd_lr:
        mode = f"gradient exchange, momentum SGD at {sgd_lr:g} with DGC's momentum correction"
    print(
        f"chargpt, {cfg.sites} sites, {cfg.rounds} rounds, {mode}, warm-up {warmup} rounds, "
        f"outer lr {cfg.outer_lr:g}"
    )
    print(f"seeds {seeds}; change vs fp32 paired per seed: mean ± stdev, min..max")
    print(f"{'codec':<26}{'loss':>9}{'vs fp32':>9}{'':>8}{'range':>18}{'goal':>7}{'':>6}")
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {
            (r.label, s): pool.submit(train, r.label, s, cfg) for r in selected for s in seeds
        }
        reference = [futures["fp32", s].result() for s in seeds]
        for run in selected:
            print(row(run, [futures[run.label, s].result() for s in seeds], reference), flush=True)
    print(f"{time.perf_counter() - start:.0f} s")


def to_target(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--to-target``: the grid (or ``--configs``) at the sizes the options give."""
    import dataclasses

    import targets

    tasks = tuple(t for t in args.tasks.split(",") if t)
    unknown = [t for t in tasks if t not in targets.TASKS]
    if unknown or not tasks:
        parser.error(f"--tasks {args.tasks!r}: choose from {', '.join(targets.TASKS)}")
    try:
        configs = tuple(targets.parse_config(c) for c in args.configs.split(";") if c.strip())
    except ValueError as e:
        parser.error(f"--configs: {e}")
    sizes = targets.QUICK if args.quick else targets.FULL
    changes: dict[str, object] = {
        "configs": configs,
        "task_options": args.task_options,
        "other_order": args.reference_order == "other",
    }
    steps: dict[str, int] = {}
    try:
        for part in filter(None, (args.rounds or "").split(",")):
            task, _, count = part.rpartition("=")
            if task and task not in tasks:
                raise ValueError(f"{task!r} is not among --tasks")
            if task:
                steps[task] = int(count)
            else:
                changes["steps"] = int(count)
    except ValueError as e:
        parser.error(f"--steps {args.rounds!r}: S, or task=S per task ({e})")
    if args.sites is not None:
        changes["sites"] = args.sites
    if args.cap is not None:
        changes["cap"] = args.cap
    if args.seeds is not None:
        try:
            changes["seeds"] = tuple(int(s) for s in args.seeds.split(","))
        except ValueError:
            parser.error(f"--seeds {args.seeds!r}: comma-separated integers")
    sizes = dataclasses.replace(sizes, **changes)  # type: ignore[arg-type]
    if min(sizes.steps, sizes.sites, *steps.values()) < 1 or not sizes.cap >= 1 or not sizes.seeds:
        parser.error("--steps and --sites must be >= 1, --cap >= 1, and --seeds not empty")
    if args.payloads:
        targets.payloads(sizes, tasks)
        return
    targets.run(sizes, tasks, args.jobs, steps)


if __name__ == "__main__":
    main()

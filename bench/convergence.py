"""Convergence benchmark: the embedded task trained with each codec, loss relative to FP32.

    python bench/convergence.py                          # default (~5 min on 2 cores)
    python bench/convergence.py --rounds 150 --seeds 0,1,2,3,4 --jobs 2   # the fair run
    python bench/convergence.py --to-target --jobs 2     # bytes to a target loss (bench/targets.py)
    python bench/convergence.py --exchange gradient --sites 2 --rounds 170 --only "fp16,topk 1% +" \\
        --switch fp16:50,topk --switch topk:50,fp16                      # a policy's switches

It mirrors the federation. Each of N simulated sites starts a round from the shared
weights, takes ``--local-steps`` AdamW steps (its optimizer state persists, as an agent's
does) and sends the pseudo-gradient ``delta = w_start - w_end`` through its codec with its
own error feedback (``p = g + e; c = C(p); e = p - D(c)``). The coordinator averages the
decoded deltas, compresses the mean back with its own error feedback (DoubleSqueeze; Top-k
at the union's density, ``Codec.for_downlink``) and every site applies ``w -= D(c)``.
``--exchange gradient`` is the coordinator's ``exchange = "gradient"``
(``skyfed.agent.momentum``, the same code), Deep Gradient Compression's setting (Lin et
al. 2018): raw gradients every step, momentum SGD
(``--sgd-lr``, momentum 0.9) with DGC's momentum correction (each site accumulates its
velocity ``u = 0.9 u + g`` and error feedback accumulates ``lr * u``, so the residual is
DGC's ``v``) and, for Top-k, momentum factor masking (a coordinate that went restarts
its velocity); ``--rounds`` then counts steps, and EC-SGD clips as the coordinator's
policy does under that exchange (``PolicyConfig.for_gradient_exchange``).
``--exchange gradient-adamw`` sends raw gradients every step and applies AdamW after
aggregation instead (data-parallel AdamW), for comparison. A run that diverges (EC-SGD
refuses non-finite input) shows as ``diverged``.

``--switch "fp16:50,topk"`` adds a run whose codec changes at the named rounds (FP16 for
50, then Top-k; repeatable), each codec with the coordinator's ``[policy]`` defaults for
the exchange (Top-k: 5 % under ``delta``, 1 % under ``gradient``): what a link policy's
switches cost in convergence, without the lab's clock. ``topk~10`` warms Top-k's density
up over the step's first 10 rounds, as ``[policy] topk_warmup_rounds = 10`` does.

``--overlap`` adds, for every run, the same run with overlap of exchange and compute (the
coordinator's ``overlap = true``, docs/wan.md#overlap): each site trains round t+1 from
the weights before round t's aggregate, which is applied after those local steps (one
round stale); the row ``<codec> + overlap`` is relative to FP32 without overlap, so it
reads as the codec's cost plus overlap's.

Every codec runs on the same seeds (same initial weights, same batches), so the loss
relative to FP32 is paired per seed; the table gives its mean and spread over seeds.
Top-k without error feedback shows what the residual is for.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch
from torch import nn

from skyfed.agent.momentum import MomentumCorrection
from skyfed.compression import Codec, ErrorFeedback, decode_payload, frame, make_codec
from skyfed.compression.policy import PolicyConfig
from skyfed.coordinator.outer import OuterOptimizer
from skyfed.tasks import load_task
from skyfed.tasks.base import Task

CodecAt = Callable[[int], Codec]  # round -> the codec used in that round
OVERLAP = " + overlap"  # a run label's suffix: the same run, one round stale
MOMENTUM = 0.9  # --exchange gradient's SGD momentum, the coordinator's default
Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True, slots=True)
class Run:
    label: str
    goal: float | None = None  # allowed loss increase over FP32, as a fraction
    feedback: bool = True


RUNS = [
    Run("fp32"),
    Run("fp16", goal=0.005),
    Run("bf16"),
    Run("topk 1% + EF", goal=0.01),
    Run("topk 5% + EF", goal=0.01),
    Run("topk 0.1% + EF + warm-up", goal=0.03),
    Run("topk 1%, no EF", feedback=False),
    Run("ecsgd 2-bit + EF", goal=0.03),
    Run("ecsgd 1-bit + EF", goal=0.03),
]


def switching(label: str, gradient: bool) -> CodecAt:
    """A ``--switch`` run: ``"fp16:50,topk:80,fp16"`` is FP16 for rounds 0-49, Top-k for
    the next 80, then FP16, each codec with the coordinator's ``[policy]`` defaults for
    the exchange, as a link policy switching at those rounds would run them.
    ``"fp16:50,topk~10"`` warms Top-k's density up over its first 10 rounds, as
    ``topk_warmup_rounds = 10`` does from a link's switch to Top-k."""
    steps: list[tuple[int, CodecAt]] = []  # (first round after this step, codec by round)
    end = 0
    parts = label.split(",")
    for i, part in enumerate(parts):
        named, _, rounds = part.partition(":")
        name, _, warmup = named.partition("~")
        if not rounds and i < len(parts) - 1:
            raise ValueError(f"{part!r}: only the last codec may run without a round count")
        if rounds and int(rounds) <= 0:
            raise ValueError(f"{part!r}: a codec runs for at least one round")
        if warmup and (name != "topk" or int(warmup) <= 0):
            raise ValueError(f"{part!r}: only topk warms up, over at least one round")
        policy = PolicyConfig(topk_warmup_rounds=int(warmup or 0))
        policy = policy.for_gradient_exchange() if gradient else policy
        steps.append((end + int(rounds) if rounds else 2**62, _step(name, policy, end)))
        end = steps[-1][0]  # the last step lasts
    return lambda t: next(codec_at(t) for until, codec_at in steps if t < until)


def _step(name: str, policy: PolicyConfig, start: int) -> CodecAt:
    """``name`` under ``policy`` in a step that starts at round ``start``."""
    if not policy.topk_warmup_rounds:
        # seed: reproducible rounding for a stochastic codec (EC-SGD), as in codec_at
        codec = make_codec(name, seed=0, **policy.codec_params(name))
        return lambda _: codec
    return lambda t: make_codec(name, **policy.codec_params(name, t - start))


def codec_at(label: str, warmup_rounds: int, gradient: bool) -> CodecAt:
    """The codec schedule behind a run's label, with the coordinator's ``[policy]``
    defaults for the exchange (``gradient``: ``--exchange gradient``)."""
    if all(r.label != label for r in RUNS):  # a --switch schedule, even of one codec
        return switching(label, gradient)
    policy = PolicyConfig(topk_density=0.001, topk_warmup_rounds=warmup_rounds)
    if gradient:
        policy = policy.for_gradient_exchange()
    if label.startswith("topk 0.1%"):  # with the policy's density warm-up
        return lambda t: make_codec("topk", **policy.codec_params("topk", t))
    if label.startswith("ecsgd"):
        policy.ecsgd_bits = int(label.split()[1][0])
        codec = make_codec("ecsgd", seed=0, **policy.codec_params("ecsgd"))
        return lambda _: codec
    fixed = {
        "fp32": make_codec("fp32"),
        "fp16": make_codec("fp16"),
        "bf16": make_codec("bf16"),
        "topk 1%": make_codec("topk", density=0.01),
        "topk 5%": make_codec("topk", density=0.05),
    }
    codec = next(c for prefix, c in fixed.items() if label.startswith(prefix))
    return lambda _: codec


def framing_bytes(payload: bytes) -> int:
    """The frame's header, codec parameters and padding (compression/frame.py): all
    before the body."""
    f = frame.unpack(payload, max_body=len(payload) << 4)
    return len(frame.header(f.codec, f.shape, f.params))


class Diverged(Exception):
    """A site's update is no longer finite (codecs refuse such input)."""


class Exchange:
    """One round trip of every tensor: N uplinks, the average, the outer step, the downlink.

    Counts the payload bytes it puts on the wire: every uplink, and the broadcast once per
    receiving site (the coordinator sends each member its own copy)."""

    def __init__(self, sites: int, feedback: bool, outer: OuterOptimizer | None = None) -> None:
        self.uplinks = [ErrorFeedback() for _ in range(sites)]
        self.downlink = ErrorFeedback()
        self.feedback = feedback
        # The coordinator's outer step on the mean, before the downlink's codec (None: the
        # mean as it is, federated averaging at rate 1).
        self.outer = outer
        self.bytes_up = 0  # payload bytes, all uplinks together
        self.bytes_down = 0  # payload bytes, the broadcast times the sites receiving it
        # Of those, the frames' headers and codec parameters (fixed per tensor, ~60 B for
        # Top-k: what dominates a tiny model's sparse payloads), both ways.
        self.bytes_framing = 0

    def send(self, ef: ErrorFeedback, codec: Codec, tensors: Tensors) -> tuple[Tensors, int, int]:
        """What the receiver decodes of ``tensors`` sent together (one contribution), the
        payload bytes that took, and how many of them were the frames' headers."""
        if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
            raise Diverged
        if not self.feedback:
            payloads = {k: codec.encode(g) for k, g in tensors.items()}
        else:
            payloads = dict(ef.encode(codec, tensors.items()))
        sent = sum(len(p) for p in payloads.values())
        framing = sum(framing_bytes(p) for p in payloads.values())
        decoded = {k: decode_payload(p, shape=tensors[k].shape) for k, p in payloads.items()}
        return decoded, sent, framing

    def average(self, codec: Codec, sent: list[Tensors]) -> Tensors:
        return self.round_trip(codec, sent)[0]

    def round_trip(self, codec: Codec, sent: list[Tensors]) -> tuple[Tensors, list[Tensors]]:
        """The decoded broadcast, and what each uplink delivered."""
        ups = []
        for ef, tensors in zip(self.uplinks, sent, strict=True):
            delivered, size, framing = self.send(ef, codec, tensors)
            ups.append(delivered)
            self.bytes_up += size
            self.bytes_framing += framing
        mean = {key: sum(u[key] for u in ups) / len(sent) for key in sent[0]}
        if self.outer is not None:
            mean = dict(zip(mean, self.outer.step(list(mean.values())), strict=True))
        down, size, framing = self.send(self.downlink, codec.for_downlink(len(sent)), mean)
        self.bytes_down += size * len(sent)
        self.bytes_framing += framing * len(sent)
        return down, ups

    def data_parallel_step(self, codec: Codec, sites: list[Site]) -> None:
        """Every site's gradient exchanged and averaged, then one step of the (shared)
        model's optimizer on the mean: data-parallel training over this exchange."""
        mean = self.average(codec, [s.gradient() for s in sites])
        params = dict(sites[0].model.named_parameters())
        for name, g in mean.items():
            params[name].grad = g
        sites[0].optimizer.step()


class Site:
    """One simulated agent: its batches and its own optimizer over the shared model."""

    def __init__(
        self, task: Task, model: nn.Module, shard: int, sites: int, seed: int, sgd_lr: float
    ) -> None:
        self.task = task
        self.model = model
        self.batches = task.batches(shard, sites, seed)
        self.optimizer = task.make_optimizer(model.parameters())
        # The agent's exchange = "gradient", when the run uses it.
        self.correction = MomentumCorrection(sgd_lr, MOMENTUM) if sgd_lr else None

    def momentum_step(self) -> Tensors:
        """The agent's ``exchange = "gradient"``: ``lr * u`` after ``u = m u + g``."""
        assert self.correction is not None
        gradients = self.gradient()
        return dict(zip(gradients, self.correction.step(list(gradients.values())), strict=True))

    def gradient(self) -> Tensors:
        """The gradient of the loss on this site's next batch (left in ``.grad`` too)."""
        self.model.zero_grad(set_to_none=True)
        self.task.loss(self.model, next(self.batches)).backward()
        return {n: p.grad.detach() for n, p in self.model.named_parameters()}

    def delta(self, local_steps: int) -> Tensors:
        """``w_start - w_end`` over ``local_steps`` AdamW steps; the weights are restored."""
        named = dict(self.model.named_parameters())
        start = {n: p.detach().clone() for n, p in named.items()}
        for _ in range(local_steps):
            self.gradient()
            self.optimizer.step()
        with torch.no_grad():
            delta = {n: start[n] - p for n, p in named.items()}
            for n, p in named.items():
                p.copy_(start[n])
        return delta


@dataclass(frozen=True, slots=True)
class Config:
    rounds: int
    sites: int
    local_steps: int  # 0: exchange gradients every step, AdamW after aggregation
    warmup_rounds: int
    sgd_lr: float = 0.0  # > 0: Deep Gradient Compression's setting at this SGD rate
    outer_lr: float = 1.0  # the coordinator's outer_lr: w -= outer_lr * mean


def train(label: str, seed: int, cfg: Config) -> float:
    """Held-out loss after ``cfg.rounds`` compressed exchanges; inf if training diverged."""
    try:
        return _train(label, seed, cfg)
    except Diverged:
        return math.inf


def _train(label: str, seed: int, cfg: Config) -> float:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    task = load_task("chargpt")
    model = task.build_model(seed)
    overlap = label.endswith(OVERLAP)
    label = label.removesuffix(OVERLAP)
    run = next((r for r in RUNS if r.label == label), Run(label))  # or a --switch run
    schedule = codec_at(label, cfg.warmup_rounds, gradient=cfg.sgd_lr > 0)
    sites = [Site(task, model, shard, cfg.sites, seed, cfg.sgd_lr) for shard in range(cfg.sites)]
    exchange = Exchange(cfg.sites, run.feedback)
    params = dict(model.named_parameters())
    pending: Tensors | None = None  # overlap: the aggregate in flight while sites train
    for t in range(cfg.rounds):
        codec = schedule(t)
        if cfg.sgd_lr:
            mean, ups = exchange.round_trip(codec, [s.momentum_step() for s in sites])
            for site, delivered in zip(sites, ups, strict=True):  # Top-k's momentum masking
                assert site.correction is not None
                site.correction.mask(list(delivered.values()), codec)
        elif cfg.local_steps == 0:
            exchange.data_parallel_step(codec, sites)
            continue
        else:
            mean = exchange.average(codec, [s.delta(cfg.local_steps) for s in sites])
        if overlap:  # these deltas were computed before the previous round's aggregate
            mean, pending = pending, mean
        with torch.no_grad():
            for name, u in (mean or {}).items():
                params[name].sub_(u, alpha=cfg.outer_lr)
    if overlap and pending:  # the last round's aggregate, once its exchange is done
        with torch.no_grad():
            for name, u in pending.items():
                params[name].sub_(u, alpha=cfg.outer_lr)
    return task.eval_loss(model)


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
    parser.add_argument(
        "--exchange", choices=("delta", "gradient", "gradient-adamw"), default="delta"
    )
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
        "--tasks", default="chargpt,digits", help="--to-target's tasks, comma-separated"
    )
    parser.add_argument(
        "--configs",
        default="",
        help="--to-target: these configurations instead of the grid, ';'-separated, e.g. "
        '"H=16 sgd topk 1%% 2-bit; H=64 nesterov:lr=0.3,m=0.8 fp16"; "H=128,lr=4.5e-3 ...": '
        "the local steps' own inner AdamW rate (the reference keeps the task's)",
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
    args = parser.parse_args()
    if args.to_target or args.quick:
        to_target(parser, args)
        return
    if args.overlap and args.exchange != "delta":
        parser.error("--overlap needs --exchange delta (the agent overlaps local steps)")
    local_steps = 0 if args.exchange == "gradient-adamw" else args.local_steps
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
    if args.overlap:
        selected += [Run(r.label + OVERLAP, feedback=r.feedback) for r in selected]
    mode = f"{local_steps} local AdamW steps per round" if local_steps else "AdamW on gradients"
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

"""Bytes to a target loss: what each configuration puts on the wire, both ways, to reach
the held-out loss that per-step FP32 data-parallel training reaches after S steps.

    flock /tmp/skyfed-heavy.lock python bench/convergence.py --to-target --jobs 2   # ~20 min
    python bench/convergence.py --to-target --quick                                  # ~30 s
    python bench/convergence.py --to-target --steps chargpt=4096,digits=1024 \
        --configs "H=128 sgd ecsgd 2-bit b128; H=64 nesterov:lr=0.5,m=0.8 fp32"   # a subset
    python bench/convergence.py --to-target --payloads   # one contribution's bytes per codec

A codec's compression ratio is not what a user pays; bytes (and steps) to a loss are. The
reference is the baseline, not skyfed: data parallelism as all-reduce runs it, every step
every site's gradient up in FP32 and the mean back in FP32, and the task's optimizer
stepping on it (``bench/baseline.py``). Its held-out loss after S steps, seed by seed, is the
target: the point target, one evaluation at S; the smoothed target, the mean of its 11
evaluations at S - 5e ... S + 5e (e = 2 % of S), which estimates the same curve at S
without the one draw's noise; and the banded target, the smoothed one plus that mean's
standard error (a seed reached within the target's own noise). Each has its table; the
per-seed table after them gives the targets and each configuration's steps to each, and
a line counts the seeds on which each configuration reaches the point target within the
cap at >= 1000x. Every configuration (local steps, outer optimizer, codec) then runs the
product's round in one process (``skyfed/simulate.py``: the agent's own sites, each
link's codec with the policy's parameters and its own error feedback, the coordinator's
weighted mean, norm clipping, outer step and downlink with its error feedback) until the
coordinator's held-out evaluation of its weights reaches the target, or the step cap.
Each evaluation of the held-out loss is the mean over 10 fixed held-out batches (chargpt)
or over all held-out images (digits), the same batches every time, so two evaluations
differ only by the weights.

Each table gives, per configuration, the seeds that reached the target, the payload bytes
up and down to it (the uplink of every site, the broadcast once per site), the ratio of
the reference's bytes to those (per seed, then mean ± standard error), and the steps of
local compute to the target as a multiple of S. The last line names the configuration
with the largest ratio (the smallest over the tasks) among those that reached the target
on every seed of every task within 1.5x the steps; if none did, the largest ratio at any
step count, with its step multiple. The last line is the smoothed target's; the two
before it the point and the banded targets'.

``--reference-order other`` adds a calibration row, not a configuration: the reference's
own training (per-step FP32 data-parallel, the same initial weights) with every site's
batches drawn in another order (seed + :data:`ORDER_OFFSET`), read by the same rule as the
configurations. It says how often the target is within reach of data-parallel training
itself when only the data order changes (on digits, about 5 seeds in 6), which bounds what
"every seed" can ask of any configuration (docs/outer-optimizer.md).
"""

from __future__ import annotations

import math
import re
import statistics
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace

import torch
from baseline import DataParallel
from results_file import host

from skyfed.compression import frame, lowbit, make_codec
from skyfed.compression.policy import PolicyConfig
from skyfed.compression.topk import Params as TopkParams
from skyfed.coordinator.model import RoundRules
from skyfed.coordinator.outer import OUTER_OPTIMIZERS, OuterSettings
from skyfed.simulate import Diverged, Simulation, sharded
from skyfed.tasks import load_task

STEP_GOAL = 1.5  # the bound: at most this many times the reference's steps
RATIO_GOAL = 1000  # the goal: at least this many times fewer bytes than the reference
ORDER_OFFSET = 1000  # --reference-order other: the sites' batches are drawn from seed + this
# The tasks, sized so the full grid runs in ~20 minutes on 2 cores (docs/outer-optimizer.md);
# the grid's default is the first two. ``llama`` is the config-built Hugging Face Llama
# example at its own size (107k parameters; the ``hf`` extra).
TASKS = {
    "chargpt": "chargpt?d_model=32&block=32&batch=8&eval_batches=10",
    "digits": "skyfed.tasks.examples:digits",
    "llama": "skyfed.tasks.llama:llama",
}


CodecPolicy = tuple[str, PolicyConfig]
"""A codec every link runs, and the coordinator's ``[policy]`` that sets its parameters."""

# label -> the codec and its policy under the delta exchange
CODECS: dict[str, CodecPolicy] = {
    "fp32": ("fp32", PolicyConfig()),
    "fp16": ("fp16", PolicyConfig()),
    "topk 5% int8": ("topk", PolicyConfig()),
    "topk 5% 2-bit": ("topk", PolicyConfig(topk_bits=2)),
    "ecsgd 2-bit": ("ecsgd", PolicyConfig()),
}
LOCAL_STEPS = (1, 4, 16, 64)
# (local steps, outer optimizer spec, codec label[, inner lr]): ``H=128,lr=4.5e-3`` gives the
# local steps their own inner AdamW rate (the reference keeps the task's).
Config = tuple[int, str, str] | tuple[int, str, str, float]
_CODEC_LABEL = re.compile(r"topk (\d+(?:\.\d+)?)% (int8|[234]-bit)|ecsgd ([124])-bit(?: b(\d+))?")
_CONFIG_LABEL = re.compile(r"H=(\d+)(?:,lr=([0-9.eE+-]+))? (\S+) (.+)")
# The calibration row's key among the configurations (--reference-order other): one step a
# "round", FP32 both ways; it runs :func:`reference_other_order`, not :func:`reach`.
OTHER_ORDER: Config = (1, "data-parallel", "fp32")


OVERLAP = " + overlap"
"""A codec label's suffix: the configuration runs the coordinator's ``overlap = true``."""


def codec_policy(label: str) -> CodecPolicy:
    """A codec label's codec and policy: one of :data:`CODECS`, ``topk P% int8``,
    ``topk P% N-bit`` (N = 2, 3, 4) or ``ecsgd N-bit`` (N = 1, 2, 4; ``ecsgd 2-bit b128``:
    blocks of 128), with the policy's other parameters (at 64 local steps or more, EC-SGD
    without ``bB`` gets the long-phase rule's blocks, as a far link does); either may end
    in :data:`OVERLAP`."""
    label = label.removesuffix(OVERLAP)
    if label in CODECS:
        return CODECS[label]
    match = _CODEC_LABEL.fullmatch(label)
    if match is None:
        raise ValueError(
            f"codec {label!r}: one of {', '.join(CODECS)}, 'topk P% int8', 'topk P% N-bit' "
            "or 'ecsgd N-bit [bB]'"
        )
    density, width, ecsgd, block = match.groups()
    if ecsgd:
        blocks = {"ecsgd_block": int(block)} if block else {}
        return "ecsgd", PolicyConfig(ecsgd_bits=int(ecsgd), **blocks)
    bits = 8 if width == "int8" else int(width[0])
    return "topk", PolicyConfig(topk_density=float(density) / 100, topk_bits=bits)


def outer_settings(spec: str) -> OuterSettings:
    """``sgd`` or ``nesterov``, optionally ``:lr=X,m=Y`` (unset: the optimizer's default,
    DiLoCo's 0.7/0.9 for Nesterov, federated averaging for SGD)."""
    kind, _, options = spec.partition(":")
    values: dict[str, float] = {}
    for part in filter(None, options.split(",")):
        key, _, value = part.partition("=")
        if key not in ("lr", "m"):
            raise ValueError(f"outer {spec!r}: options are lr= and m=, not {key!r}")
        values[key] = float(value)
    return OuterSettings.resolve(kind, values.get("lr"), values.get("m"))


def parse_config(text: str) -> Config:
    """``"H=16 nesterov:lr=0.3,m=0.8 topk 1% 2-bit"`` -> ``(16, "nesterov:lr=0.3,m=0.8",
    "topk 1% 2-bit")``; ``"H=128,lr=4.5e-3 sgd fp32"`` adds the local steps' inner rate as a
    fourth element; ValueError names what is wrong."""
    match = _CONFIG_LABEL.fullmatch(text.strip())
    if match is None or int(match[1]) < 1:
        raise ValueError(
            f"configuration {text!r}: 'H=<local steps>[,lr=<inner lr>] <outer> <codec>'"
        )
    outer_settings(match[3])
    codec_policy(match[4])
    if match[2] is None:
        return int(match[1]), match[3], match[4]
    try:
        inner = float(match[2])
    except ValueError:
        inner = math.nan
    if not inner > 0:
        raise ValueError(f"configuration {text!r}: the inner lr {match[2]!r} must be a number > 0")
    return int(match[1]), match[3], match[4], inner


@dataclass(frozen=True, slots=True)
class Sizes:
    """One run of the grid: S, the cap and who takes part."""

    steps: int  # S: the reference's steps, which set the target
    cap: float  # a configuration stops after cap * S steps without reaching the target
    sites: int
    seeds: tuple[int, ...]
    local_steps: tuple[int, ...] = LOCAL_STEPS
    outers: tuple[str, ...] = OUTER_OPTIMIZERS
    codecs: tuple[str, ...] = tuple(CODECS)
    configs: tuple[Config, ...] = ()  # when given, these instead of the grid above
    task_options: str = ""  # appended to every task's spec ("lr=1e-3": the inner AdamW's)
    # Add the calibration row (--reference-order other): the reference's training with the
    # sites' batches from seed + ORDER_OFFSET, the same initial weights.
    other_order: bool = False

    def grid(self) -> list[Config]:
        """Every row this run measures, in the table's order: the configurations, then
        the calibration row when :attr:`other_order` is set."""
        configs = list(self.configs) or [
            (h, outer, codec)
            for h in self.local_steps
            for outer in self.outers
            for codec in self.codecs
        ]
        return configs + [OTHER_ORDER] * self.other_order

    def task(self, key: str, inner_lr: float | None = None) -> str:
        """The task's spec, with :attr:`task_options` added to its own, and ``lr=`` (its inner
        AdamW's rate, every task's option) when a configuration sets its own."""
        options = [o for o in (self.task_options, inner_lr and f"lr={inner_lr!r}") if o]
        spec = TASKS[key]
        if not options:
            return spec
        return f"{spec}{'&' if '?' in spec else '?'}{'&'.join(options)}"

    @property
    def eval_every(self) -> int:
        """Steps between evaluations when a round is shorter: 2 % of S."""
        return max(1, self.steps // 50)


FULL = Sizes(steps=256, cap=STEP_GOAL, sites=2, seeds=(0, 1, 2, 3, 4))
QUICK = Sizes(
    steps=16,
    cap=1.5,
    sites=2,
    seeds=(0, 1),
    local_steps=(4,),
    codecs=("fp32", "topk 5% 2-bit"),
)


SMOOTH = 5  # the smoothed target: the mean of DP's evaluations S-5e ... S+5e (e: eval_every)
TARGETS = ("point", "smoothed", "banded")  # the target's definitions, each with its table


@dataclass(frozen=True, slots=True)
class Reference:
    target: float  # held-out loss after S steps (the point target)
    bytes: int  # both ways, over the S steps
    framing: int  # of those, the frames' headers
    smoothed: float = math.nan  # the mean of the 2 * SMOOTH + 1 evaluations centred on S
    noise: float = 0.0  # that mean's standard error (the evaluations' spread / sqrt(11))

    def of(self, kind: str) -> float:
        """The target of that definition (:data:`TARGETS`); ``banded``: the smoothed target
        plus its own standard error, a seed reached within the target's noise."""
        if kind == "point":
            return self.target
        return self.smoothed + (self.noise if kind == "banded" else 0.0)


@dataclass(frozen=True, slots=True)
class Reached:  # one configuration on one seed, against one target
    steps: int  # local steps of compute when the evaluation first met the target
    bytes_up: int
    bytes_down: int
    reached: bool
    loss: float  # the held-out loss at that evaluation (or at the cap)
    framing: int = 0  # of bytes_up + bytes_down, the frames' headers and codec parameters


def reference(task_key: str, seed: int, sizes: Sizes) -> Reference:
    """Per-step FP32 data-parallel training for S steps: the target and its bytes. It
    trains on to S + 5e and evaluates every e steps from S - 5e for the smoothed target:
    one evaluation at S is one draw of its noisy curve (the data order's, not the held-out
    set's: that is fixed), and a seed whose draw fell low fails every configuration by
    that noise alone (docs/outer-optimizer.md)."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    dp = DataParallel(load_task(sizes.task(task_key)), seed, sizes.sites)
    every = sizes.eval_every
    window: list[float] = []
    point, total, framing = math.nan, 0, 0
    for step in range(1, sizes.steps + SMOOTH * every + 1):
        dp.step()
        if step == sizes.steps:
            point = dp.eval_loss()
            total, framing = dp.bytes, dp.framing
            window.append(point)
        elif abs(step - sizes.steps) <= SMOOTH * every and (step - sizes.steps) % every == 0:
            window.append(dp.eval_loss())
    noise = statistics.stdev(window) / math.sqrt(len(window)) if len(window) > 1 else 0.0
    return Reference(point, total, framing, statistics.fmean(window), noise)


Trajectory = list[Reached]  # every evaluation of one run, in order (``reached`` unset)


def reference_other_order(
    task_key: str, seed: int, sizes: Sizes, config: Config, target: float
) -> Trajectory:
    """The calibration row: :func:`reference`'s training, the same initial weights (the
    model built from ``seed``), with every site's batches drawn from ``seed +
    ORDER_OFFSET``, evaluated every e steps, at S and at the cap, until the held-out loss is
    at most ``target``: read by :func:`first` as a configuration's run is. Whether the
    seed's target is reached here is whether data-parallel training itself reaches it when
    only the data order changes (``config`` is :data:`OTHER_ORDER`, for :func:`run`)."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    dp = DataParallel(load_task(sizes.task(task_key)), seed, sizes.sites, seed + ORDER_OFFSET)
    cap = int(sizes.cap * sizes.steps)
    evaluations: Trajectory = []
    for step in range(1, cap + 1):
        dp.step()
        if step % sizes.eval_every == 0 or step in (sizes.steps, cap):
            loss = dp.eval_loss()
            evaluations.append(Reached(step, dp.bytes // 2, dp.bytes // 2, False, loss, dp.framing))
            if loss <= target:
                break
    return evaluations


def simulation(task_key: str, seed: int, sizes: Sizes, config: Config) -> Simulation:
    """The federation a configuration describes: ``sizes.sites`` sites, site ``i`` on shard
    ``i`` of the data (the reference's batches), every link on the configuration's codec."""
    local_steps, outer, codec_label = config[:3]
    inner_lr = config[3] if len(config) > 3 else None  # the local steps' own rate, if set
    codec, policy = codec_policy(codec_label)
    rules = RoundRules(outer=outer_settings(outer), policy=policy, seed=seed)
    sites = sharded(sizes.sites, local_steps=local_steps, codec=codec)
    overlap = codec_label.endswith(OVERLAP)
    return Simulation(sizes.task(task_key, inner_lr), sites, rules, seed=seed, overlap=overlap)


def reach(task_key: str, seed: int, sizes: Sizes, config: Config, target: float) -> Trajectory:
    """One configuration's rounds until its held-out loss is at most ``target`` (the lower
    of the definitions'), every evaluation on the way: :func:`first` reads off when each
    definition's target was met."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    sim = simulation(task_key, seed, sizes, config)
    evaluated = 0
    cap = int(sizes.cap * sizes.steps)
    evaluations: Trajectory = []
    while sim.steps < cap:
        try:
            sim.round()
        except Diverged:
            evaluations.append(_reached(sim, math.inf))
            return evaluations
        if sim.steps - evaluated >= sizes.eval_every or sim.steps >= cap:
            evaluated = sim.steps
            evaluations.append(_reached(sim, sim.evaluate()))
            if evaluations[-1].loss <= target:
                break
    return evaluations


def _reached(sim: Simulation, loss: float) -> Reached:
    return Reached(sim.steps, sim.bytes_up, sim.bytes_down, False, loss, sim.framing)


def first(evaluations: Trajectory, target: float) -> Reached:
    """The first evaluation at or under ``target``, or the last (``reached`` False)."""
    for e in evaluations:
        if e.loss <= target:
            return replace(e, reached=True)
    return evaluations[-1]


def payloads(sizes: Sizes, tasks: tuple[str, ...]) -> None:
    """One contribution's bytes per codec of the grid, and the broadcast's, each with the
    frames' share: what bounds the ratio per round on a model of this many tensors. The
    round is the simulation's first, of 16 local steps (seed 0); the contribution is
    site 0's."""
    codecs = list(dict.fromkeys(c[2] for c in sizes.grid() if c != OTHER_ORDER))
    for t in tasks:
        model = load_task(sizes.task(t)).build_model(0)
        numel = [p.numel() for p in model.parameters()]
        raw = 4 * sum(numel)
        small = sum(n for n in numel if n < 1024)
        print(
            f"\n{t}: {raw // 4} parameters in {len(numel)} tensors ({small} in tensors under "
            f"1024 elements); FP32 {raw} B per contribution"
        )
        print(
            f"{'codec':<22}{'up B':>8}{'framing':>9}{'indices':>9}{'down B':>8}{'framing':>9}"
            f"{'indices':>9}{'ratio':>8}"
        )
        for label_ in codecs:
            torch.manual_seed(0)
            sim = simulation(t, 0, sizes, (16, "sgd", label_))
            result = sim.round(keep=True)
            cells = ""
            total = 0
            for sent in (result.uplinks[0], result.broadcast):
                size = sum(map(len, sent))
                framing = sum(map(frame.header_length, sent))
                indices = sum(map(_index_bytes, sent))
                cells += f"{size:>8}{framing:>9}{indices:>9}"
                total += size
            print(f"{label_:<22}{cells}{2 * raw / total:>7.1f}x")


def _index_bytes(payload: bytes) -> int:
    """A Top-k payload's index section (as sent: zstd'd when smaller); 0 for other codecs.
    The body is the values section (``k`` INT8 bytes, or low-bit's scales and bit
    planes, compression/lowbit.py) then the indices."""
    f = frame.unpack(payload, max_body=len(payload) << 4)
    if f.codec != make_codec("topk").wire_id:
        return 0
    p = TopkParams.unpack(f.params)
    if p.value_kind == 2:  # low-bit values
        values = lowbit.section_bytes(p.k, p.bits, p.block)
    else:
        values = p.k * (1 if p.value_kind == 0 else 2)
    return len(payload) - frame.header_length(payload) - values


def label(config: Config) -> str:
    if config == OTHER_ORDER:
        return f"FP32 DP, batches of seed+{ORDER_OFFSET}"
    local_steps, outer, codec = config[:3]
    inner = f",lr={config[3]:g}" if len(config) > 3 else ""
    return f"H={local_steps}{inner} {outer} {codec}"


def _mean_se(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return mean, se


@dataclass(frozen=True, slots=True)
class Summary:
    """One configuration on one task, over its seeds."""

    reached: int
    seeds: int
    ratio: tuple[float, float]  # reference bytes / bytes, mean ± se over reached seeds
    steps: tuple[float, float]  # steps to target / S, likewise
    unframed: float = 0.0  # the ratio's mean without either side's frame headers

    @property
    def everywhere(self) -> bool:
        return self.reached == self.seeds


def summarize(refs: list[Reference], runs: list[Reached], sizes: Sizes) -> tuple[Summary, str]:
    """The configuration's summary and its table cells."""
    done = [(ref, r) for ref, r in zip(refs, runs, strict=True) if r.reached]
    if not done:
        diverged = sum(not math.isfinite(r.loss) for r in runs)
        finite = [r.loss for r in runs if math.isfinite(r.loss)]
        # how far from the target it ended: the mean held-out loss at the cap
        at_cap = f" (loss {statistics.fmean(finite):.4f} at the cap)" if finite else ""
        note = f"diverged on {diverged}" if diverged else f"not within {sizes.cap:g}x S{at_cap}"
        return Summary(0, len(runs), (0.0, 0.0), (math.inf, 0.0)), f"{0:>3}/{len(runs)}  {note}"
    up = _mean_se([r.bytes_up / 1e6 for _, r in done])
    down = _mean_se([r.bytes_down / 1e6 for _, r in done])
    framing = statistics.fmean(r.framing / (r.bytes_up + r.bytes_down) for _, r in done)
    ratio = _mean_se([ref.bytes / (r.bytes_up + r.bytes_down) for ref, r in done])
    unframed = statistics.fmean(
        (ref.bytes - ref.framing) / (r.bytes_up + r.bytes_down - r.framing) for ref, r in done
    )
    steps = _mean_se([r.steps / sizes.steps for _, r in done])
    cells = (
        f"{len(done):>3}/{len(runs)}{up[0]:>10.3f} ±{up[1]:>7.3f}{down[0]:>10.3f} ±{down[1]:>7.3f}"
        f"{framing:>7.0%}{unframed:>10.0f}x{ratio[0]:>10.1f}x ±{ratio[1]:>7.1f}"
        f"{steps[0]:>7.2f}x ±{steps[1]:>5.2f}"
    )
    return Summary(len(done), len(runs), ratio, steps, unframed), cells


def best(summaries: dict[Config, list[Summary]]) -> str:
    """The last line: the largest ratio (the worse task's) within the step goal, if any,
    among the configurations (the calibration row is none)."""
    everywhere = {
        c: s for c, s in summaries.items() if c != OTHER_ORDER and all(x.everywhere for x in s)
    }
    if not everywhere:
        return "best bytes-to-target ratio: none (no configuration reached the target everywhere)"
    within = {c: s for c, s in everywhere.items() if all(x.steps[0] <= STEP_GOAL for x in s)}
    pool = within or everywhere
    config = max(pool, key=lambda c: min(x.ratio[0] for x in pool[c]))
    ratio = min(x.ratio[0] for x in pool[config])
    steps = max(x.steps[0] for x in pool[config])
    return f"best bytes-to-target ratio: {ratio:.0f}x ({label(config)}) at {steps:.1f}x the steps"


def run(
    sizes: Sizes, tasks: tuple[str, ...], jobs: int, steps: dict[str, int] | None = None
) -> None:
    """The whole grid on every task, printed as it completes, once per target definition
    (:data:`TARGETS`), then each seed's steps to each; ``steps`` gives a task its own S
    (the others keep ``sizes.steps``)."""
    configs = sizes.grid()
    print(f"host: {host()}", flush=True)  # seeds compare only on one CPU model
    start = time.perf_counter()
    summaries = {k: {c: list[Summary]() for c in configs} for k in TARGETS}
    sized = {t: replace(sizes, steps=(steps or {}).get(t, sizes.steps)) for t in tasks}
    with ProcessPoolExecutor(jobs) as pool:
        refs = {(t, s): pool.submit(reference, t, s, sized[t]) for t in tasks for s in sizes.seeds}
        runs: dict[tuple[str, Config, int], Future[Trajectory]] = {}
        for t in tasks:
            for c in configs:
                for s in sizes.seeds:
                    lowest = min(refs[t, s].result().of(k) for k in TARGETS)
                    train = reference_other_order if c == OTHER_ORDER else reach
                    runs[t, c, s] = pool.submit(train, t, s, sized[t], c, lowest)
        for t in tasks:
            sizes = sized[t]
            ref = [refs[t, s].result() for s in sizes.seeds]
            width = max(26, *(len(label(c)) + 1 for c in configs))
            for kind in TARGETS:
                target = _mean_se([r.of(kind) for r in ref])
                what = (
                    f"after S={sizes.steps} steps"
                    if kind == "point"
                    else f"averaged over its {2 * SMOOTH + 1} evaluations S ± {SMOOTH}x"
                    f"{sizes.eval_every} steps, S={sizes.steps}"
                    + (", plus that mean's standard error" if kind == "banded" else "")
                )
                name = {"point": "", "smoothed": "smoothed ", "banded": "banded "}[kind]
                print(
                    f"\n{t}: {name}target held-out loss "
                    f"{target[0]:.4f} ± {target[1]:.4f} = per-step FP32 data-parallel {what}, "
                    f"{sizes.sites} sites; its bytes to target {ref[0].bytes / 1e6:.3f} MB; cap "
                    f"{sizes.cap:g}x S; seeds {sizes.seeds}"
                    + (f"; task options {sizes.task_options}" if sizes.task_options else "")
                )
                print(
                    f"{'configuration':<{width}}{'seeds':>7}{'up MB':>10}{'':>9}{'down MB':>10}"
                    f"{'':>9}{'frames':>7}{'unframed':>11}{'vs FP32 DP':>11}{'':>9}{'steps/S':>8}"
                )
                for c in configs:
                    reached = [
                        first(runs[t, c, s].result(), r.of(kind))
                        for s, r in zip(sizes.seeds, ref, strict=True)
                    ]
                    summary, cells = summarize(ref, reached, sizes)
                    summaries[kind][c].append(summary)
                    print(f"{label(c):<{width}}{cells}", flush=True)
            _per_seed(t, sizes, ref, configs, runs, width)
            print(f"\n{t}, point target: {_seed_counts(t, sizes, ref, configs, runs)}")
    print(f"\n{time.perf_counter() - start:.0f} s; mean ± standard error over seeds")
    for kind in TARGETS:
        for t, i in zip(tasks, range(len(tasks)), strict=True):
            line = best({c: [s[i]] for c, s in summaries[kind].items()})
            print(f"{t}, {kind} target: {line}")
    print(f"point target: {best(summaries['point'])}")
    print(f"banded target: {best(summaries['banded'])}")
    print(best(summaries["smoothed"]))


def _per_seed(
    task: str,
    sizes: Sizes,
    ref: list[Reference],
    configs: list[Config],
    runs: dict[tuple[str, Config, int], Future[Trajectory]],
    width: int,
) -> None:
    """Each seed's targets, and each configuration's steps/S to them ("-": not within
    the cap; after it, the lowest held-out loss the run saw): why a seed misses, by how
    much, and whether the target's noise is the reason."""
    print(
        f"\n{task} per seed: point / smoothed / banded target; steps/S to each "
        "(-: not within the cap)"
    )
    cells = "".join(f"{f'seed {s}':>29}" for s in sizes.seeds)
    print(f"{'':<{width}}{cells}")
    cells = "".join(f"{' / '.join(f'{r.of(k):.4f}' for k in TARGETS):>29}" for r in ref)
    print(f"{'DP target':<{width}}{cells}")
    for c in configs:
        cells = ""
        for s, r in zip(sizes.seeds, ref, strict=True):
            evaluations = runs[task, c, s].result()
            steps = [first(evaluations, r.of(k)) for k in TARGETS]
            text = " / ".join(f"{x.steps / sizes.steps:.2f}" if x.reached else "-" for x in steps)
            if not steps[1].reached:  # the smoothed target's
                text += f" ({min(e.loss for e in evaluations):.4f})"
            cells += f"{text:>29}"
        print(f"{label(c):<{width}}{cells}")


def reached_at_goal(ref: Reference, evaluations: Trajectory) -> bool:
    """Whether a run reached the seed's point target within the cap at no fewer than
    :data:`RATIO_GOAL` times fewer bytes than the reference (the issue's two bounds)."""
    r = first(evaluations, ref.target)
    return r.reached and ref.bytes >= RATIO_GOAL * (r.bytes_up + r.bytes_down)


def _seed_counts(
    task: str,
    sizes: Sizes,
    ref: list[Reference],
    configs: list[Config],
    runs: dict[tuple[str, Config, int], Future[Trajectory]],
) -> str:
    """The seeds each configuration reaches within the cap at >= RATIO_GOAL x (the goal's
    count) and, with the calibration row, the seeds whose point target the other data
    order reaches within the cap: the counts the two are compared by."""
    seeds = list(zip(sizes.seeds, ref, strict=True))
    n = len(seeds)
    parts = []
    if OTHER_ORDER in configs:
        dp = sum(first(runs[task, OTHER_ORDER, s].result(), r.target).reached for s, r in seeds)
        parts.append(f"{label(OTHER_ORDER)} {dp}/{n}")
    for c in configs:
        if c != OTHER_ORDER:
            goal = sum(reached_at_goal(r, runs[task, c, s].result()) for s, r in seeds)
            parts.append(f"{label(c)} at >= {RATIO_GOAL}x {goal}/{n}")
    return f"seeds reached within {sizes.cap:g}x S: " + "; ".join(parts)

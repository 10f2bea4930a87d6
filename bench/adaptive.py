"""Adaptive link policy against every fixed codec, over a link that changes mid-run.

    sudo python bench/adaptive.py                        # 5 codecs x 4 seeds, ~40 min
    sudo python bench/adaptive.py --codecs fp16,topk,ecsgd,auto:table --seeds 0,1,2,3,4,5
    sudo python bench/adaptive.py --exchange delta       # the federation's default
    sudo python bench/adaptive.py --codecs topk,auto:table --set-policy 'heavy = "topk"'

Each run builds a fresh network lab (root, network namespaces): a coordinator and two
agents, ``aws-1`` on a steady ``lan`` link and ``gcp-1`` on a link that is near (10 ms,
200 Mbit/s) for ``--near-s``, far (300 ms, 1 % loss, 20 Mbit/s) for ``--far-s``, then near
again, and trains ``--task`` with one fixed codec, or with the link policy: ``auto:table``
and ``auto:cost`` (``auto`` alone takes ``--policy``; ``--set-policy`` adds ``[policy]``
lines). The clock starts when round 0 opens; the schedule, when it closes.

The federation runs ``--exchange gradient`` by default (Deep Gradient Compression's
setting: one momentum-SGD step per round, ``--local-steps 1``), the exchange in which
the codecs trade off on this task: on 2 CPU cores an FP16 round is the fastest on the
near link and the slowest on the far one (docs/compression.md#what-the-policy-achieves
and its runs under bench/results/ have the per-round times).
Under ``--exchange delta`` (4 local AdamW steps, target 2.0) FP16 has the fastest near
rounds and Top-k (at that exchange's 5 % default) and EC-SGD the fast far ones; Top-k
needs the fewest rounds, about the same on every seed, while FP16's and EC-SGD's move
with the seed (docs/compression.md#what-the-policy-achieves).

The target is the **held-out** loss (``task.eval_loss``) of the coordinator's weights,
which it checkpoints after every round, **averaged over the last 10 rounds**: the bench
keeps each round's checkpoint, checks the latest every ``--eval-every-s`` and stops a run
once a 10-round mean is under ``--target-loss`` (or after ``--max-s``): when the mean of
its last 3 checks is, it evaluates every kept round from where the checks came within
0.1 of the target. It reports the first round whose 10-round mean is at or under the
target, the time to that round's close, and the bytes both ways until then. Without the
mean, the first round that dipped under the target decided: near 2.3 the curve falls
~0.002 a round and moves a few hundredths from round to round (momentum SGD's noise in
the weights; the held-out batches are fixed), so one dip moved a run's rounds-to-target
by tens of rounds. The agents' training loss is not used: one small batch per step,
noisier still.

Each codec runs every seed (initial weights and data order); the table gives mean and
standard deviation over seeds of the time to target, its exchange part (round time less
the slowest agent's local training), rounds and MB, and how many seeds each codec was
fastest on. "Overall" is time to target first (the issue's goal), then bytes: the
verdict line says whether ``auto`` beats every fixed codec on mean time, and whether by
more than twice the standard error of its per-seed difference from each (seeds pair
runs: the same data order and initial weights); the lines under it give those
differences. Wall time depends on the host's load (the agents train on the same cores);
a fixed codec's run repeats its rounds (EC-SGD's rounding is seeded per sender and round
from the seed), but an adaptive run switches at a wall-clock moment. Each run's held-out
loss by round goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from skyfed.coordinator import checkpoint
from skyfed.coordinator.evaluate import Evaluator as HeldOut
from skyfed.lab.federation import Federation, FederationSpec
from skyfed.lab.profiles import LinkProfile, Schedule, ScheduleStep, load_catalog
from skyfed.lab.topology import AgentSpec, Lab, LabSpec, tear_down_on_signals
from skyfed.tasks import load_task
from skyfed.tasks.base import Task
from skyfed.wire import EXCHANGES

FAR = LinkProfile(name="bench-far", rtt_ms=300.0, jitter_ms=2.0, loss_pct=1.0, rate_mbit=20.0)
NEAR = LinkProfile(name="bench-near", rtt_ms=10.0, jitter_ms=0.5, rate_mbit=200.0)
POLL_S = 0.1
SMOOTH_ROUNDS = 10
"""The target is met by the mean held-out loss over this many rounds' weights."""
CHECKS_TO_STOP = 3
SCAN_MARGIN = 0.1
# Per exchange: targets reached after the far phase (~155-220 rounds, 83-110 s, under
# gradient exchange with the 60 s far phase), so that every run crosses both link changes;
# a run that ends inside the first near phase measures nothing of the policy.
DEFAULTS = {
    "gradient": {"target_loss": 2.3, "max_s": 150.0, "local_steps": 1},
    "delta": {"target_loss": 2.0, "max_s": 240.0, "local_steps": 4},
}


@dataclass(slots=True)
class Result:
    codec: str
    seed: int
    reached: bool = False
    seconds: float = float("nan")
    rounds: int = 0
    eval_loss: float = float("nan")
    mbytes: float = float("nan")
    exchange_s: float = float("nan")
    """Of ``seconds``, what was not the slowest agent's local training: the link's part."""
    share: str = ""
    """Per downlink codec, the fraction of rounds until the target (``auto`` only varies)."""


@dataclass(slots=True)
class Snapshots:
    """Every round's checkpointed weights, as the run produced them. # round -> tensors"""

    weights: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def grab(self, checkpoint_dir: Path) -> None:
        try:
            ckpt = checkpoint.load(checkpoint_dir)
        except (OSError, RuntimeError, ValueError):
            return  # not written yet, or replaced under us: the next poll gets it
        if ckpt is not None:
            self.weights.setdefault(ckpt.round, ckpt.weights)

    @contextlib.contextmanager
    def watching(self, checkpoint_dir: Path) -> Iterator[None]:
        """Grab every ``POLL_S`` in a thread, so that evaluations do not make it miss rounds."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(POLL_S):
                self.grab(checkpoint_dir)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


class Evaluator:
    """Held-out loss of a round's weights (the coordinator's own evaluation,
    ``coordinator/evaluate.py``), cached, and its mean over a window of rounds."""

    def __init__(self, task: Task) -> None:
        self.evaluator = HeldOut(task, every=1)
        self.cache: dict[int, float] = {}
        self.checks: list[float] = []
        """The losses ``check`` saw during the run, in order."""

    def __call__(self, snaps: Snapshots, round_: int) -> float:
        if round_ not in self.cache:
            self.cache[round_] = self.evaluator.evaluate(round_, snaps.weights[round_]).loss
        return self.cache[round_]

    def check(self, snaps: Snapshots, target: float) -> bool:
        """During the run: True once a snapshot's smoothed loss is at or under ``target``.

        Every check evaluates the latest snapshot; only once the mean of the last
        ``CHECKS_TO_STOP`` of those is under the target does it evaluate every snapshot
        (:meth:`first_below`), which costs CPU the training shares: that mean is usually
        past the smoothed crossing already, so what it slows comes after it. When it is
        not (the checks ran a little ahead), the run goes on and later checks evaluate the
        new snapshots only."""
        self.checks.append(self(snaps, max(snaps.weights)))
        recent = self.checks[-CHECKS_TO_STOP:]
        if len(recent) < CHECKS_TO_STOP or statistics.mean(recent) > target:
            return False
        return self.first_below(snaps, target) is not None

    def smoothed(self, snaps: Snapshots, round_: int) -> float:
        """Mean held-out loss of the snapshots of the last ``SMOOTH_ROUNDS`` rounds up to
        ``round_``: what the weights are worth, less one step's noise."""
        window = [r for r in list(snaps.weights) if round_ - SMOOTH_ROUNDS < r <= round_]
        return statistics.mean(self(snaps, r) for r in window)

    def first_below(self, snaps: Snapshots, target: float) -> int | None:
        """The first snapshot round whose smoothed loss is at or under ``target``.

        Scanned from where the run's checks first came within ``SCAN_MARGIN`` of the
        target (every snapshot from there is evaluated, each once), not from round 0:
        the smoothed loss cannot be under the target ``SMOOTH_ROUNDS`` rounds before the
        checks, ~10 rounds apart, were all ``SCAN_MARGIN`` above it, given the curve's
        round-to-round noise (a few hundredths)."""
        near = [r for r, loss in self.cache.items() if loss <= target + SCAN_MARGIN]
        if not near:
            return None
        for r in [r for r in sorted(snaps.weights) if r >= min(near)]:
            if self.smoothed(snaps, r) <= target:
                return r
        return None


def run(codec: str, seed: int, args: argparse.Namespace, workdir: Path) -> Result:
    catalog = load_catalog()
    catalog.profiles.update({NEAR.name: NEAR, FAR.name: FAR})
    agents = (AgentSpec(name="aws-1", profile="lan"), AgentSpec(name="gcp-1", profile=NEAR.name))
    spec = _federation_spec(codec, seed, args, workdir)
    evaluate = Evaluator(load_task(args.task))
    snaps = Snapshots()
    with Lab(spec=LabSpec(agents=agents), catalog=catalog) as lab:
        Federation(lab, spec, workdir).start()
        with snaps.watching(workdir / "checkpoints"):
            _train(lab, args, workdir, snaps, evaluate)
    rounds = _rounds(workdir / "status.json")
    hit = evaluate.first_below(snaps, args.target_loss)
    last = hit if hit is not None else max(snaps.weights, default=-1)
    curve = " ".join(f"{r}:{loss:.3f}" for r, loss in sorted(evaluate.cache.items()))
    print(f"... {codec} seed {seed} held-out loss by round: {curve}", file=sys.stderr)
    loss = evaluate.smoothed(snaps, last) if last >= 0 else float("nan")
    return _result(codec, seed, rounds, last, hit is not None, loss)


def _federation_spec(
    codec: str, seed: int, args: argparse.Namespace, workdir: Path
) -> FederationSpec:
    policy = f'mode = "{_policy(codec, args)}"\n' + "".join(f"{kv}\n" for kv in args.set_policy)
    (workdir / "coordinator.toml").write_text(
        f'task = "{args.task}"\nseed = {seed}\n[rounds]\nexchange = "{args.exchange}"\n'
        f"[monitor]\nwindow_s = 1.0\n[policy]\n{policy}"
    )
    (workdir / "agent.toml").write_text(
        f'task = "{args.task}"\nseed = {seed}\nlocal_steps = {args.local_steps}\n'
    )
    coordinator_args = (
        "--codec",
        codec.partition(":")[0],
        "--config",
        str(workdir / "coordinator.toml"),
    )
    coordinator_args += ("--status-file", str(workdir / "status.json"), "--heartbeat-ms", "200")
    agent_args = ("--config", str(workdir / "agent.toml"))
    return FederationSpec(rounds=100_000, coordinator_args=coordinator_args, agent_args=agent_args)


def _train(
    lab: Lab, args: argparse.Namespace, workdir: Path, snaps: Snapshots, evaluate: Evaluator
) -> None:
    """Poll checkpoints until one is under the target, or ``--max-s`` after round 0."""
    started = None
    checked = time.monotonic()
    deadline = time.monotonic() + args.max_s + 60  # start-up included
    while time.monotonic() < deadline:
        time.sleep(POLL_S)
        if snaps.weights and started is None:
            lab.run_schedule("gcp-1", _schedule(args))  # the link changes with training
            started = time.monotonic()
        if started and time.monotonic() - started > args.max_s:
            return
        if snaps.weights and time.monotonic() - checked > args.eval_every_s:
            checked = time.monotonic()
            if evaluate.check(snaps, args.target_loss):
                return


def _schedule(args: argparse.Namespace) -> Schedule:
    steps = ((NEAR.name, args.near_s), (FAR.name, args.far_s), (NEAR.name, 3600.0))
    return Schedule(
        name="near-far-near", steps=tuple(ScheduleStep(profile=p, hold_s=s) for p, s in steps)
    )


def _rounds(path: Path) -> list[dict]:
    try:
        return json.loads(path.read_text()).get("rounds", [])
    except (OSError, ValueError):
        return []


def _result(
    codec: str, seed: int, rounds: list[dict], last: int, reached: bool, loss: float
) -> Result:
    """Time and bytes from round 0's opening to round ``last``'s close."""
    until = [r for r in rounds if int(r.get("round", 0)) <= last]
    seconds = sum(r.get("durationS", 0.0) for r in until)
    exchange_s = seconds - sum(r.get("trainS", 0.0) for r in until)
    nbytes = sum(int(r.get("bytesUp", 0)) + int(r.get("bytesDown", 0)) for r in until)
    names = [str(r.get("downlinkCodec", codec)).split(":")[0] for r in until]  # no params
    share = " ".join(f"{n}:{names.count(n) / len(names):.0%}" for n in sorted(set(names)))
    return Result(codec, seed, reached, seconds, len(until), loss, nbytes / 1e6, exchange_s, share)


def _mean_sd(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def table(results: list[Result], codecs: list[str]) -> Iterator[str]:
    """One line per codec: mean ± sd over seeds of time, rounds, time per round and MB."""
    yield (
        f"{'codec':<11}{'reached':>8}{'time s':>15}{'exchange s':>15}{'rounds':>14}{'MB':>15}"
        f"{'fastest':>9}"
    )
    for codec in codecs:
        rs = [r for r in results if r.codec == codec]
        ok = [r for r in rs if r.reached]
        cols = (
            _mean_sd([r.seconds for r in ok]),
            _mean_sd([r.exchange_s for r in ok]),
            _mean_sd([float(r.rounds) for r in ok]),
            _mean_sd([r.mbytes for r in ok], 2),
        )
        wins = f"{sum(_fastest(results, r.seed) == codec for r in rs)}/{len(rs)}"
        yield (
            f"{codec:<11}{f'{len(ok)}/{len(rs)}':>8}"
            + "".join(f"{c:>15}" for c in cols)
            + (f"{wins:>8}")
        )
    for r in results:
        if _adaptive(r.codec):
            yield f"  {r.codec} seed {r.seed}: rounds per downlink codec {r.share}"


def _fastest(results: list[Result], seed: int) -> str:
    """The codec that reached the target first with ``seed`` ("" if none did)."""
    ok = [r for r in results if r.seed == seed and r.reached]
    return min(ok, key=lambda r: r.seconds).codec if ok else ""


def paired(results: list[Result], a: str, b: str) -> list[float]:
    """Per seed on which both reached the target: ``a``'s time less ``b``'s, in seconds.
    Seeds share data order and initial weights, so the difference drops what a seed does
    to both."""
    by = {(r.codec, r.seed): r for r in results if r.reached}
    seeds = sorted({r.seed for r in results})
    return [by[a, s].seconds - by[b, s].seconds for s in seeds if (a, s) in by and (b, s) in by]


def verdict(results: list[Result], codecs: list[str]) -> Iterator[str]:
    """Does each adaptive policy beat every fixed codec on mean time to target, and by
    more than twice the standard error of the per-seed difference? Bytes as the tie-break."""
    means = {}
    for codec in codecs:
        rs = [r for r in results if r.codec == codec]
        if rs and all(r.reached for r in rs):
            means[codec] = (
                statistics.mean(r.seconds for r in rs),
                statistics.mean(r.mbytes for r in rs),
            )
    fixed = {c: m for c, m in means.items() if not _adaptive(c)}
    for policy in (c for c in codecs if _adaptive(c)):
        if policy not in means or not fixed:
            yield f"verdict: {policy} or every fixed codec missed the target in some run"
            continue
        lines, clear = [], True
        for codec in fixed:
            diffs = paired(results, policy, codec)
            if not diffs:
                clear = False
                lines.append(f"  {policy} - {codec}: no seed on which both reached the target")
                continue
            se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("inf")
            clear &= statistics.mean(diffs) + 2 * se < 0
            wins = sum(d < 0 for d in diffs)
            lines.append(
                f"  {policy} - {codec}: {statistics.mean(diffs):+.1f} ± {se:.1f} s per seed "
                f"(mean ± standard error), faster on {wins}/{len(diffs)} seeds"
            )
        best = min(fixed, key=lambda c: fixed[c])
        (t_auto, b_auto), (t_best, b_best) = means[policy], fixed[best]
        word = "does not beat"
        if t_auto < t_best:
            word = "beats (beyond 2 standard errors)" if clear else "beats, within noise,"
        yield (
            f"verdict: {policy} {word} the fastest fixed codec ({best}) on mean time to "
            f"target: {t_auto:.1f} s vs {t_best:.1f} s ({(t_auto / t_best - 1):+.0%}); "
            f"bytes {b_auto:.2f} MB vs {b_best:.2f} MB"
        )
        yield from lines


def _adaptive(codec: str) -> bool:
    return codec.partition(":")[0] == "auto"


def _policy(codec: str, args: argparse.Namespace) -> str:
    """The link policy's mode for ``auto:MODE`` (``--policy`` for a bare ``auto``)."""
    return codec.partition(":")[2] or args.policy


def _keep(workdir: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for path in [workdir / "status.json", *workdir.glob("*.log")]:
        if path.exists():
            shutil.copy(path, dest / path.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codecs", default="fp16,topk,ecsgd,auto:table,auto:cost")
    parser.add_argument("--seeds", default="0,1,2,3", help="comma-separated; every codec runs each")
    parser.add_argument("--task", default="chargpt", help="registered task name")
    parser.add_argument(
        "--policy", choices=("table", "cost"), default="table", help="mode of a bare auto"
    )
    parser.add_argument(
        "--target-loss", type=float, help="held-out loss (default: 2.3 gradient, 2.0 delta)"
    )
    parser.add_argument("--near-s", type=float, default=10.0)
    parser.add_argument("--far-s", type=float, default=60.0)
    parser.add_argument("--max-s", type=float, help="default: 150 gradient, 240 delta")
    parser.add_argument("--eval-every-s", type=float, default=2.0)
    parser.add_argument("--exchange", choices=EXCHANGES, default="gradient")
    parser.add_argument("--local-steps", type=int, help="default: 1 gradient, 4 delta")
    parser.add_argument(
        "--set-policy",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [policy] TOML line for the coordinator (repeatable)",
    )
    parser.add_argument("--keep", type=Path, help="copy each run's status and logs here")
    args = parser.parse_args(argv)
    tear_down_on_signals()  # Ctrl-C or kill ends the bench, not just the run in progress
    # One thread for this process's evaluations: they share 2 cores with the lab's
    # coordinator and agents, and two threads spinning against them made the scan for the
    # crossing (~90 snapshots) take ~100 s after each run's target.
    torch.set_num_threads(1)
    for key, value in DEFAULTS[args.exchange].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    codecs = args.codecs.split(",")
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for codec in codecs:
            with tempfile.TemporaryDirectory(prefix=f"skyfed-adaptive-{codec}-") as tmp:
                results.append(run(codec, seed, args, Path(tmp)))
                if args.keep:
                    _keep(Path(tmp), args.keep / f"{codec}-seed{seed}")
                print(f"... {results[-1]}", file=sys.stderr, flush=True)
    print(
        f"task {args.task}; link: {NEAR.rtt_ms:g} ms for {args.near_s:g} s, "
        f"then {FAR.rtt_ms:g} ms {FAR.loss_pct:g}% loss {FAR.rate_mbit:g} Mbit/s for "
        f"{args.far_s:g} s, then {NEAR.rtt_ms:g} ms; exchange {args.exchange}, "
        f"{args.local_steps} local steps; target held-out loss {args.target_loss}; "
        f"seeds {args.seeds}"
    )
    print("\n".join(table(results, codecs)))
    print("\n".join(verdict(results, codecs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

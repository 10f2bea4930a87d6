"""Wall-clock and bytes to data-parallel's held-out loss: skyfed across far links against
per-step data-parallel on a near one, the same model, data and per-site compute, in one run.

    sudo flock /tmp/skyfed-heavy.lock python bench/time_to_target.py --record chargpt
    sudo python bench/time_to_target.py --quick        # a tiny model, the whole path

(a) **Data-parallel** (the baseline, not skyfed; ``bench/baseline.py``): 3 processes, one
    per site, one thread each, a torch.distributed Gloo group over loopback (the near
    link), every step each site's gradient on its own shard all-reduced into the mean,
    then the task's optimizer (AdamW), for S steps. Its held-out loss after S steps is the
    target; its bytes are counted as the convergence benches count them (each site's FP32
    gradient up and the FP32 mean down, every step).
(b) **skyfed**: the network lab (root, namespaces), the real ``coordinator serve`` and 3
    ``agent start`` (mTLS, a throwaway CA), agent ``i`` on shard ``i`` with one thread,
    each on its own link of the run's profile: ``far-gigabit`` (100 ms RTT, 1 Gbit/s,
    0.1 % loss each way) and ``cross-region`` (120 ms, 100 Mbit/s, 0.5 %), at the far-link
    defaults: ``--local-steps`` 128 with the local AdamW at ``--inner-lr``, ``codec =
    auto`` (the link policy picks; a link of long phases runs EC-SGD 2-bit in blocks of
    1024), FedAvg. The coordinator evaluates its weights on the held-out data every round
    (``eval_every = 1``, off the rounds' path); the run stops at the first evaluation at or
    under the target, or at ``--cap`` x S steps.

Before training, each link's RTT and loss are measured against the profile (the lab's
self-check; the rate is not: the payloads are a few kB, far below either rate, and
1 Gbit/s is above the lab's delay line's ceiling, docs/lab.md); a link that does not
match stops the run.

Per run it prints the wall-clock (data-parallel: first step to last; skyfed: round 0's
opening to the close of the round whose evaluation reached the target), its split (the
all-reduce's share; the slowest site's training per round against the rest, the
exchange), the steps to the target and the bytes: payload bytes as the coordinator counts
them (every contribution, the broadcast to every site; what the ratio uses), and every
byte the three links carried both ways from the federation's start (TLS, heartbeats,
loss probes and gRPC framing included). ``--runs default,overlap`` adds runs with the
coordinator's ``overlap = true``; ``fp32`` fixes the codec at FP32 (no compression), to
tell the levers apart. The last line is the worst run's:
``time to target: X.XXx data-parallel's wall-clock, NNNNx fewer bytes (<config>)``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from baseline import GlooResult, gloo_data_parallel  # bench/, beside this script
from results_file import host, record

from skyfed.coordinator.history import ROUNDS_FILE, read, rounds
from skyfed.lab.federation import Federation, FederationSpec
from skyfed.lab.netns import why_unavailable
from skyfed.lab.profiles import LinkProfile, load_catalog
from skyfed.lab.selfcheck import measure_link
from skyfed.lab.topology import COORDINATOR, AgentSpec, Lab, LabSpec, tear_down_on_signals

AGENTS = ("aws-1", "gcp-1", "azure-1")
TASK = "chargpt?d_model=32&block=32&batch=8&eval_batches=10"
"""bench/targets.py's chargpt: the bytes-to-target figures' model."""
FAR_GIGABIT = LinkProfile(name="far-gigabit", rtt_ms=100.0, loss_pct=0.1, rate_mbit=1000.0)
RUNS = {
    "default": (),
    "overlap": ("--overlap",),
    "fp32": ("--codec", "fp32"),
}
"""A run's coordinator options on top of the far-link defaults."""
POLL_S = 0.5


@dataclass(frozen=True, slots=True)
class Reached:
    """What a federation's history says about its way to the target."""

    reached: bool
    round: int
    """The round whose evaluation first met the target (the last evaluated, if none did)."""
    loss: float
    wall_s: float
    """From round 0's opening to that round's close."""
    train_s: float
    """Of ``wall_s``, the slowest site's local training, summed over the rounds."""
    bytes: int
    """Payload bytes of those rounds, every contribution and the broadcast to every site."""
    codecs: str = ""
    """The broadcast's codec over those rounds, as runs: ``fp16 x6, ecsgd x119``."""


def read_target(run_dir: Path, target: float) -> Reached | None:
    """The first evaluation of the coordinator's weights at or under ``target`` in
    ``run_dir``'s history, or the last one (``reached`` False); None before any. Only the
    rounds up to the evaluated one count (a round's line once: timing lines add none)."""
    path = run_dir / ROUNDS_FILE
    if not path.exists():
        return None
    lines = read(path)
    evals = [x for x in lines if x.get("kind") == "eval" and math.isfinite(x["eval_loss"])]
    closed = rounds(lines)
    if not evals or 0 not in closed:
        return None
    hit = next((e for e in evals if e["eval_loss"] <= target), None)
    chosen = hit or evals[-1]
    r = int(chosen["round"])
    if r not in closed:
        return None
    upto = [closed[k] for k in sorted(closed) if k <= r]
    started = closed[0]["wall_s"] - closed[0]["duration_s"]  # round 0's opening
    return Reached(
        reached=hit is not None,
        round=r,
        loss=float(chosen["eval_loss"]),
        wall_s=closed[r]["wall_s"] - started,
        train_s=sum(float(x.get("train_s", 0.0)) for x in upto),
        bytes=sum(int(x.get("bytes_up", 0)) + int(x.get("bytes_down", 0)) for x in upto),
        codecs=_runs(str(x.get("downlink_codec", "")) for x in upto),
    )


def _runs(names: Iterable[str]) -> str:
    """``fp16 x6, ecsgd x119``: consecutive equal names counted."""
    groups = [(name, len(list(run))) for name, run in itertools.groupby(names)]
    return ", ".join(f"{name or '?'} x{count}" for name, count in groups)


@dataclass(frozen=True, slots=True)
class SkyfedRun:
    profile: str
    run: str
    local_steps: int
    reached: Reached
    link_bytes: int
    """Every byte the links carried both ways, from the federation's start to the stop."""

    @property
    def steps(self) -> int:
        return (self.reached.round + 1) * self.local_steps

    def config(self, args: argparse.Namespace) -> str:
        extra = "" if self.run == "default" else f", {self.run}"
        return (
            f"{self.profile}, H={self.local_steps}, inner lr {args.inner_lr:g}, codec auto, "
            f"FedAvg{extra}; {args.task_label}, S={args.steps}, seed {args.seed}"
        )


def time_to_target_line(dp: GlooResult, run: SkyfedRun, args: argparse.Namespace) -> str:
    """The bench's verdict on one run, in the issue's words."""
    x = run.reached.wall_s / dp.wall_s
    ratio = dp.bytes / max(1, run.reached.bytes)
    miss = "" if run.reached.reached else f"; NOT REACHED by {run.steps / args.steps:.2f}x S"
    return (
        f"time to target: {x:.2f}x data-parallel's wall-clock, {ratio:.0f}x fewer bytes "
        f"({run.config(args)}{miss})"
    )


def skyfed_run(
    profile: str, run: str, target: float, args: argparse.Namespace, work: Path
) -> SkyfedRun:
    """One federation in a fresh lab until the coordinator's evaluation meets ``target``."""
    catalog = load_catalog()
    catalog.profiles[FAR_GIGABIT.name] = FAR_GIGABIT
    task = f"{args.task}&lr={args.inner_lr!r}"
    rounds_max = math.ceil(args.cap * args.steps / args.local_steps)
    run_dir = work / "run"
    coordinator = ["--task", task, "--seed", str(args.seed), "--eval-every", "1"]
    coordinator += ["--run-dir", str(run_dir), "--final-wait-s", "5", *RUNS[run]]
    agent = ["--task", task, "--seed", str(args.seed), "--local-steps", str(args.local_steps)]
    agent += ["--threads", "1", "--no-progress"]
    spec = FederationSpec(
        rounds=rounds_max,
        round_deadline_s=600.0,
        coordinator_args=tuple(coordinator),
        agent_args=tuple(agent),
    )
    agents = tuple(AgentSpec(name=a, profile=profile) for a in AGENTS)
    with Lab(spec=LabSpec(agents=agents), catalog=catalog) as lab:
        check_links(lab)
        fed = Federation(lab, spec, work)
        fed.start()
        start_bytes = link_bytes(lab)
        reached = wait_for_target(fed, run_dir, target)
        carried = link_bytes(lab) - start_bytes
        stop(fed)
    return SkyfedRun(profile, run, args.local_steps, reached, carried)


def check_links(lab: Lab) -> None:
    """Each link's RTT and loss against its profile (not its rate: see the docstring)."""
    for name in AGENTS:
        expected = replace(lab.link(name).profile, rate_mbit=0.0)
        report = measure_link(lab, name, expected=expected)
        if report.problems:
            raise SystemExit(f"link {name} does not match its profile: {report.summary()}")
        print(f"link {report.summary()}", flush=True)


def link_bytes(lab: Lab) -> int:
    """Bytes sent so far on every link, both ends (IP packets: headers included)."""
    total = 0
    for name in AGENTS:
        link = lab.link(name)
        total += sum(end.ns.link_stats(end.dev)["bytes"] for end in (link.a, link.b))
    return total


def wait_for_target(fed: Federation, run_dir: Path, target: float) -> Reached:
    """Poll the coordinator's history until an evaluation meets ``target`` or it exits."""
    assert fed.coordinator is not None
    while True:
        done = fed.coordinator.popen.poll() is not None
        got = read_target(run_dir, target)
        if got is not None and (got.reached or done):
            return got
        if done:
            raise RuntimeError(
                f"the coordinator exited with no evaluation:\n{fed.tail(COORDINATOR)}"
            )
        time.sleep(POLL_S)


def stop(fed: Federation) -> None:
    """End the run: the agents, then the coordinator (the target is already read)."""
    for proc in fed.agent_procs.values():
        proc.stop(grace_s=5)
    if fed.coordinator is not None:
        fed.coordinator.stop(grace_s=10)


def describe(dp: GlooResult, runs: list[SkyfedRun], args: argparse.Namespace) -> list[str]:
    share = dp.allreduce_s / dp.wall_s
    lines = [
        f"host: {host()}",
        f"task {args.task_label} ({args.task}), seed {args.seed}, 3 sites, one thread each",
        f"data-parallel, 3 Gloo processes over loopback: S={dp.steps} steps in {dp.wall_s:.1f} s "
        f"({1e3 * dp.wall_s / dp.steps:.1f} ms a step, all-reduce {share:.0%} of it), "
        f"held-out loss {dp.loss:.4f} (the target), {dp.bytes / 1e6:.1f} MB",
    ]
    for r in runs:
        got = r.reached
        per_step = 1e3 * got.wall_s / r.steps
        train = got.train_s / got.wall_s
        verdict = "reached" if got.reached else "not reached"
        lines.append(
            f"skyfed {r.profile} {r.run}: {verdict}, held-out loss {got.loss:.4f} after round "
            f"{got.round}: {r.steps} steps ({r.steps / dp.steps:.2f}x S) in {got.wall_s:.1f} s "
            f"({per_step:.1f} ms a step, {per_step / (1e3 * dp.wall_s / dp.steps):.2f}x "
            f"data-parallel's; training {train:.0%} of it), payload {got.bytes / 1e6:.3f} MB "
            f"({dp.bytes / max(1, got.bytes):.0f}x fewer), on the links {r.link_bytes / 1e6:.3f} MB "
            f"({dp.bytes / max(1, r.link_bytes):.0f}x fewer); broadcast codecs {got.codecs}"
        )
    for r in runs:
        lines.append(time_to_target_line(dp, r, args))
    worst = max(runs, key=lambda r: (not r.reached.reached, r.reached.wall_s / dp.wall_s))
    lines.append(time_to_target_line(dp, worst, args))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8192, help="S: data-parallel's steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--local-steps", type=int, default=128, help="skyfed's local phase")
    parser.add_argument("--inner-lr", type=float, default=4.5e-3, help="skyfed's local AdamW")
    parser.add_argument("--profiles", default="far-gigabit,cross-region")
    parser.add_argument("--runs", default="default", help=f"of {', '.join(RUNS)}")
    parser.add_argument("--cap", type=float, default=2.0, help="skyfed stops at cap x S")
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--quick", action="store_true", help="a tiny model, S=256, H=32")
    parser.add_argument(
        "--record", metavar="WHAT", help="bench/results/<date>-time_to_target-WHAT.md"
    )
    args = parser.parse_args()
    if args.quick:
        args.task = "chargpt?n_layer=1&d_model=16&n_head=2&block=16&batch=4&eval_batches=4"
        args.steps, args.local_steps, args.profiles = 256, 32, "far-gigabit"
    args.task_label = "chargpt" if args.task == TASK else args.task
    runs = [r for r in args.runs.split(",") if r]
    profiles = [p for p in args.profiles.split(",") if p]
    unknown = [r for r in runs if r not in RUNS]
    if unknown or not runs or not profiles:
        parser.error(f"--runs {args.runs!r}: of {', '.join(RUNS)}; --profiles not empty")
    if args.steps < 1 or args.local_steps < 1 or not args.cap >= 1:
        parser.error("--steps and --local-steps must be >= 1, --cap >= 1")
    why = why_unavailable()
    if why:
        print(f"time_to_target: the lab is unavailable: {why}", file=sys.stderr)
        return 2
    tear_down_on_signals()
    dp = gloo_data_parallel(args.task, args.seed, len(AGENTS), args.steps)
    print(f"data-parallel: {dp.steps} steps in {dp.wall_s:.1f} s, loss {dp.loss:.4f}", flush=True)
    done = []
    for profile in profiles:
        for run in runs:
            with tempfile.TemporaryDirectory(prefix="skyfed-ttt-") as tmp:
                done.append(skyfed_run(profile, run, dp.loss, args, Path(tmp)))
            print("\n".join(describe(dp, done[-1:], args)[3:5]), flush=True)
    lines = describe(dp, done, args)
    print("\n".join(lines))
    if args.record:
        record("time_to_target", args.record, sys.argv[1:], lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

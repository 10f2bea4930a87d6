"""Adaptive link policy against every fixed codec, over a link that changes mid-run.

    sudo python bench/adaptive.py                       # near -> far -> near, 4 runs
    sudo python bench/adaptive.py --codecs fp16,auto --target-loss 2.2

Each run builds a fresh network lab (root, network namespaces): a coordinator and two
agents, ``aws-1`` on a steady ``lan`` link and ``gcp-1`` on a link that follows the
schedule (``--near`` for ``--near-s``, then ``--far`` for ``--far-s``, then ``--near``
again), and trains the default task with one fixed codec, or with ``--codec auto``. It
stops when a round's mean loss reaches ``--target-loss`` or after ``--max-s``, and prints
the time from the first round's opening to that round's close, and the bytes both ways.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from skyfed.lab.federation import Federation, FederationSpec
from skyfed.lab.profiles import LinkProfile, Schedule, ScheduleStep, load_catalog
from skyfed.lab.topology import AgentSpec, Lab, LabSpec

FAR = LinkProfile(name="bench-far", rtt_ms=300.0, jitter_ms=2.0, loss_pct=1.0, rate_mbit=20.0)
NEAR = LinkProfile(name="bench-near", rtt_ms=10.0, jitter_ms=0.5, rate_mbit=200.0)
MONITOR = "[monitor]\nwindow_s = 1.0\n"


@dataclass(frozen=True, slots=True)
class Result:
    codec: str
    reached: bool
    seconds: float
    rounds: int
    loss: float
    mbytes: float
    codecs_seen: str


def run(codec: str, args: argparse.Namespace, workdir: Path) -> Result:
    catalog = load_catalog()
    catalog.profiles.update({NEAR.name: NEAR, FAR.name: FAR})
    agents = (AgentSpec(name="aws-1", profile="lan"), AgentSpec(name="gcp-1", profile=NEAR.name))
    (workdir / "coordinator.toml").write_text(MONITOR)
    coordinator_args = ("--codec", codec, "--config", str(workdir / "coordinator.toml"))
    coordinator_args += ("--status-file", str(workdir / "status.json"), "--heartbeat-ms", "200")
    spec = FederationSpec(rounds=100_000, coordinator_args=coordinator_args)
    with Lab(spec=LabSpec(agents=agents), catalog=catalog) as lab:
        fed = Federation(lab, spec, workdir)
        fed.start()
        steps = ((NEAR.name, args.near_s), (FAR.name, args.far_s), (NEAR.name, 3600.0))
        schedule = Schedule(
            name="near-far-near", steps=tuple(ScheduleStep(profile=p, hold_s=s) for p, s in steps)
        )
        started = None
        deadline = time.monotonic() + args.max_s + 60
        result = None
        while time.monotonic() < deadline:
            time.sleep(0.5)
            rounds = _rounds(workdir / "status.json")
            if rounds and started is None:
                lab.run_schedule("gcp-1", schedule)  # the clock starts with training
                started = time.monotonic()
            result = _summary(codec, rounds, args.target_loss)
            if result.reached or (started and time.monotonic() - started > args.max_s):
                break
        log = fed.log("coordinator").read_text()
        seen = sorted(
            {line.split("to=")[1].split()[0] for line in log.splitlines() if "to=" in line}
        )
    assert result is not None
    return replace(result, codecs_seen=",".join(seen) or codec)


def _rounds(path: Path) -> list[dict]:
    try:
        return json.loads(path.read_text()).get("rounds", [])
    except (OSError, ValueError):
        return []


def _summary(codec: str, rounds: list[dict], target: float) -> Result:
    seconds = mbytes = 0.0
    loss = float("nan")
    for i, r in enumerate(rounds):
        seconds += r.get("durationS", 0.0)
        mbytes += (int(r.get("bytesUp", 0)) + int(r.get("bytesDown", 0))) / 1e6
        loss = r.get("meanLoss", float("nan"))
        if loss <= target:
            return Result(codec, True, seconds, i + 1, loss, mbytes, "")
    return Result(codec, False, seconds, len(rounds), loss, mbytes, "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codecs", default="fp16,topk,ecsgd,auto")
    parser.add_argument("--target-loss", type=float, default=2.3)
    parser.add_argument("--near-s", type=float, default=10.0)
    parser.add_argument("--far-s", type=float, default=30.0)
    parser.add_argument("--max-s", type=float, default=90.0)
    args = parser.parse_args(argv)
    results = []
    for codec in args.codecs.split(","):
        with tempfile.TemporaryDirectory(prefix=f"skyfed-adaptive-{codec}-") as tmp:
            results.append(run(codec, args, Path(tmp)))
            print(f"... {results[-1]}", file=sys.stderr)
    print(
        f"link: {NEAR.rtt_ms:g} ms for {args.near_s:g} s, then {FAR.rtt_ms:g} ms "
        f"{FAR.loss_pct:g}% loss {FAR.rate_mbit:g} Mbit/s for {args.far_s:g} s, then "
        f"{NEAR.rtt_ms:g} ms; target mean loss {args.target_loss}"
    )
    print(f"{'codec':<7}{'reached':>8}{'time s':>9}{'rounds':>8}{'loss':>8}{'MB':>9}  codecs")
    for r in results:
        print(
            f"{r.codec:<7}{'yes' if r.reached else 'no':>8}{r.seconds:>9.1f}{r.rounds:>8}"
            f"{r.loss:>8.3f}{r.mbytes:>9.2f}  {r.codecs_seen}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Failover under chaos: three coordinator replicas, etcd and three agents on loopback;
the leading replica is killed again and again, spread over the phases of a round.

    flock /tmp/skyfed-heavy.lock python bench/failover.py --kills 50 --record chaos-50

Every process is the product's own (``coordinator serve --replica``, ``agent start``, real
mTLS with a throwaway CA, Debian's ``etcd``). Each replica reaches etcd through a relay,
and agents and the other replicas reach it through another (``--advertise``), so the bench
can cut one off. The leader is killed (``kill -9``, by arming its failpoint file,
``skyfed/failpoints.py``) ``--kills`` times, cycling through the phases of a round:
during the uploads, during the mean, after the mean with the standbys holding the round
and no agent its end (``release``), while the round's ends go out (``broadcast``), idle
(a round just opened); and once (``--partition``, on by default) it is cut off from etcd,
the agents and the other replicas instead. Each killed replica is restarted as a standby
and the next kill waits until it follows again (it catches up by a snapshot).

After every failover it checks each agent's log: no round it had applied is lost (it
never loads weights older than a round it held) and none is applied twice; every agent
verified the same digest for every round; no standby's weights ever differed from the
leader's. At the end the agents are stopped, and the leader and every standby must hold
the same round and digest. X is the time from the kill (or the cut) to the next round
closed by the new leader.

Last line: ``failover: N kills, L rounds lost, D applied twice, p99 X.X s``.
"""

from __future__ import annotations

import argparse
import collections
import math
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from results_file import record  # bench/results_file.py, beside this script

from skyfed.certs.testing import make_federation
from skyfed.coordinator.admin import fetch_status
from skyfed.coordinator.replicas.testing import EtcdServer, Relay, agent_ledger, free_port
from skyfed.failpoints import ENV_FILE, FAILOVER_PHASES
from skyfed.procs import Children, command
from skyfed.status import Status

NAMES = ("a", "b", "c")
CLOUDS = ("aws", "gcp", "azure")
TTL_S = 2
POLL_S = 0.05
DIFFER = "differ from the leader's"


@dataclass(slots=True)
class Failover:
    phase: str
    killed: str
    round: int
    """The round the kill was armed for (the one in flight)."""
    took_s: float = math.nan
    """Kill (or cut) -> the next round closed by the new leader."""
    leader: str = ""


@dataclass
class Bench:
    """The processes, their relays and what the bench saw."""

    work: Path
    kids: Children
    etcd: EtcdServer
    ports: dict[str, int] = field(default_factory=dict)
    etcd_relays: dict[str, Relay] = field(default_factory=dict)
    relays: dict[str, Relay] = field(default_factory=dict)
    done: list[Failover] = field(default_factory=list)

    # ---- processes -----------------------------------------------------------------------

    def start_replica(self, name: str, args: argparse.Namespace) -> None:
        (self.work / f"fp-{name}").write_text("")
        flags = {
            "--replica": name,
            "--etcd": self.etcd_relays[name].url,
            "--listen": f"127.0.0.1:{self.ports[name]}",
            "--advertise": f"127.0.0.1:{self.relays[name].port}",
            "--certs": self.work / "certs",
            "--lease-ttl-s": TTL_S,
            "--min-agents": len(CLOUDS),
            "--codec": "topk",
            "--outer-optimizer": "nesterov",
            "--checkpoint-dir": self.work / f"ckpt-{name}",
            "--probe-port": -1,
            "--eval-every": 0,
            "--task": args.task,
        }
        argv = command("coordinator", "serve", *(str(x) for kv in flags.items() for x in kv))
        self.kids.start(name, argv, {ENV_FILE: str(self.work / f"fp-{name}")})

    def start_agents(self, args: argparse.Namespace) -> None:
        addresses = ",".join(f"127.0.0.1:{self.relays[n].port}" for n in NAMES)
        for cloud in CLOUDS:
            flags = {
                "--cloud": cloud,
                "--certs": self.work / "certs",
                "--coordinator": addresses,
                "--local-steps": args.local_steps,
                "--reconnect-max-s": 1,
                "--task": args.task,
            }
            argv = command("agent", "start", *(str(x) for kv in flags.items() for x in kv))
            self.kids.start(cloud, [*argv, "--no-progress"], {"SKYFED_LOG_LEVEL": "DEBUG"})

    # ---- what the replicas say -----------------------------------------------------------

    def status(self, name: str) -> Status | None:
        try:
            return fetch_status(f"127.0.0.1:{self.ports[name]}", self.work / "certs", "ops", 1)
        except Exception:  # noqa: BLE001 - down, starting, or cut off: no answer
            return None

    def leader(self, timeout_s: float = 60.0) -> tuple[str, Status]:
        """The replica that leads and its status (waits for one)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name in NAMES:
                s = self.status(name)
                if s is not None and s.replicas is not None and s.replicas.leading:
                    return name, s
            time.sleep(POLL_S)
        raise RuntimeError(f"no replica led for {timeout_s} s")

    def closed_under_new_term(self, old_term: int) -> str:
        """A replica leading in a newer term than ``old_term`` that has closed a round
        ("": none yet)."""
        for name in NAMES:
            s = self.status(name)
            r = s.replicas if s is not None else None
            if r is not None and r.leading and r.term > old_term and s.rounds:
                return name
        return ""

    def following(self, name: str) -> bool:
        """``name`` follows the leader with no lag (the leader's view)."""
        _, s = self.leader()
        assert s.replicas is not None
        return any(
            m.name == name and m.state == "following" and m.lag == 0 for m in s.replicas.members
        )

    # ---- one failover --------------------------------------------------------------------

    def kill(self, phase: str, args: argparse.Namespace, timeout_s: float) -> Failover:
        name, s = self.leader()
        assert s.replicas is not None
        term = s.replicas.term
        armed = s.round + 1  # the round after the one open now: it has every phase ahead
        event = Failover(phase, name, armed)
        proc = self.kids.procs[name]
        if phase == "partition":
            self.wait_round(name, armed, timeout_s)
            self.etcd_relays[name].cut()
            self.relays[name].cut()
            cut_at = time.monotonic()
        else:
            (self.work / f"fp-{name}").write_text(f"{phase}@{armed}")
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not reach {phase}@{armed}")
                time.sleep(0.005)
            cut_at = time.monotonic()
            if proc.returncode != -signal.SIGKILL:
                raise RuntimeError(
                    f"{name} exited {proc.returncode}:\n{self.kids.log(name)[-2000:]}"
                )
        deadline = cut_at + timeout_s
        while not (leader := self.closed_under_new_term(term)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no round closed within {timeout_s} s of losing {name}")
            time.sleep(POLL_S)
        event.took_s, event.leader = time.monotonic() - cut_at, leader
        if phase == "partition":
            self.etcd_relays[name].heal()
            self.relays[name].heal()
        else:
            self.start_replica(name, args)
        deadline = time.monotonic() + timeout_s * 3
        while not self.following(name):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not catch up:\n{self.kids.log(name)[-2000:]}")
            time.sleep(0.2)
        self.done.append(event)
        return event

    def wait_round(self, name: str, round_: int, timeout_s: float) -> None:
        """Until ``name``'s round ``round_`` has opened (a partition mid-round)."""
        deadline = time.monotonic() + timeout_s
        while (s := self.status(name)) is None or s.round < round_:
            if time.monotonic() > deadline:
                raise RuntimeError(f"round {round_} did not open at {name}")
            time.sleep(POLL_S)

    # ---- checks --------------------------------------------------------------------------

    def ledger(self) -> tuple[int, int, int]:
        """(rounds lost, rounds applied twice, rounds whose digest agents disagree on),
        over every agent's log so far."""
        ledgers = [agent_ledger(self.kids.log(cloud)) for cloud in CLOUDS]
        digests: dict[int, set[str]] = collections.defaultdict(set)
        for kept in ledgers:
            for round_, digest in kept.digests.items():
                digests[round_].add(digest)
        split = sum(len(d) > 1 for d in digests.values())
        return sum(k.lost for k in ledgers), sum(k.twice for k in ledgers), split

    def replicas_differed(self) -> int:
        return sum(self.kids.log(n).count(DIFFER) for n in NAMES)

    def settle(self) -> tuple[int, str, list[str]]:
        """Stop the agents; the leader's (round, digest) and the replicas that hold
        another."""
        for cloud in CLOUDS:
            self.kids.stop(cloud)
        time.sleep(3 * TTL_S)  # what was in flight lands; the standbys ack the last round
        name, s = self.leader()
        off = []
        for other in NAMES:
            if other == name:
                continue
            o = self.status(other)
            if o is None or (o.round, o.weights_digest) != (s.round, s.weights_digest):
                off.append(other)
        return s.round - 1, s.weights_digest, off


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def table(events: list[Failover]) -> list[str]:
    lines = [
        "| phase | failovers | kill -> next round closed s: median | p99 | min | max |",
        "|---|---|---|---|---|---|",
    ]
    phases = [*FAILOVER_PHASES, "partition"]
    for phase in [p for p in phases if any(e.phase == p for e in events)] + ["all"]:
        xs = [e.took_s for e in events if phase in ("all", e.phase)]
        lines.append(
            f"| {phase} | {len(xs)} | {statistics.median(xs):.1f} | "
            f"{nearest_rank(xs, 0.99):.1f} | {min(xs):.1f} | {max(xs):.1f} |"
        )
    return lines


def run(args: argparse.Namespace, work: Path) -> list[str]:
    ca = make_federation(work / "certs", [(c, f"{c}-1") for c in CLOUDS])
    for name in NAMES:
        ca.issue_coordinator(f"coordinator-{name}", hosts=("127.0.0.1", "localhost"))
    etcd = EtcdServer(work / "etcd")
    bench = Bench(work, Children(work / "logs"), etcd)
    try:
        for name in NAMES:
            bench.ports[name] = free_port()
            bench.etcd_relays[name] = Relay(etcd.client_port)
            bench.relays[name] = Relay(bench.ports[name])
        for name in NAMES:
            bench.start_replica(name, args)
        bench.start_agents(args)
        phases = [FAILOVER_PHASES[i % len(FAILOVER_PHASES)] for i in range(args.kills)]
        if args.partition:
            phases.insert(len(phases) // 2, "partition")
        for i, phase in enumerate(phases):
            e = bench.kill(phase, args, args.timeout_s)
            lost, twice, split = bench.ledger()
            print(
                f"{i + 1}/{len(phases)} {phase}: {e.killed} -> {e.leader} at round {e.round}, "
                f"{e.took_s:.1f} s; lost {lost}, twice {twice}, split {split}",
                file=sys.stderr,
                flush=True,
            )
        lost, twice, split = bench.ledger()
        last, digest, off = bench.settle()
        differed = bench.replicas_differed()
    finally:
        bench.kids.stop_all()
        for relay in [*bench.etcd_relays.values(), *bench.relays.values()]:
            relay.close()
        etcd.stop()
    events = bench.done
    kills = sum(e.phase != "partition" for e in events)
    xs = [e.took_s for e in events]
    lines = [
        f"3 replicas (lease TTL {TTL_S} s), etcd, 3 agents on loopback, task {args.task}, "
        f"--local-steps {args.local_steps}; {kills} kills (kill -9) and "
        f"{len(events) - kills} partition(s); X: kill (or cut) -> the next round closed",
        "",
        *table(events),
        "",
        f"rounds whose digest agents disagree on: {split}; standby acks with other weights "
        f"than the leader's: {differed}; at the end (round {last}, {digest[:16]}) replicas "
        f"holding another state: {off or 'none'}",
        "",
        f"failover: {kills} kills, {lost} rounds lost, {twice} applied twice, "
        f"p99 {nearest_rank(xs, 0.99):.1f} s",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="kill -9s of the leader (10).")
    parser.add_argument(
        "--partition",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Also cut the leader off from etcd, the agents and the replicas once (on).",
    )
    parser.add_argument("--task", default="chargpt", help="The federation's task (chargpt).")
    parser.add_argument("--local-steps", type=int, default=4, help="Agents' local steps (4).")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="Per failover step (60).")
    parser.add_argument("--keep", type=Path, help="Keep the run's directory (logs) here.")
    parser.add_argument(
        "--record", metavar="WHAT", help="Also write bench/results/<date>-failover-WHAT.md."
    )
    args = parser.parse_args(argv)
    raw = sys.argv[1:] if argv is None else argv
    if args.kills < 1:
        parser.error("--kills must be >= 1")
    with tempfile.TemporaryDirectory(prefix="skyfed-failover-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        lines = run(args, work)
    print("\n".join(lines))
    if args.record:
        print(f"recorded in {record('failover', args.record, raw, lines)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

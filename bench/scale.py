"""The exchange path at scale: a real coordinator and agents on loopback, by model size.

    flock /tmp/skyfed-heavy.lock python bench/scale.py                  # 1M,10M,25M,100M x fp16,topk
    python bench/scale.py --params 1M,10M --codecs fp16 --agents 3
    python bench/scale.py --params 100M --codecs fp16 --record baseline # bench/results/...

Every run starts the real ``coordinator serve`` and ``--agents`` ``agent start`` processes
(real mTLS with a throwaway CA, loopback) on ``skyfed.tasks.examples:wide?params=N`` (four
square Linear layers, ``--local-steps``, 1 unless told) with one fixed codec, and runs
``--rounds`` rounds. Per size and codec it prints medians over the rounds after the first
``--warmup`` (1 unless told; 3 leaves out the rounds whose checkpoint is a new file, not
the recycled spare of the steady state: docs/scale.md, Checkpoints):

- round s: a round's duration as the coordinator reports it (open to close; the next
  round opens at the close, so in steady state this is the whole cycle, broadcast and the
  agents' apply included);
- training s: the slowest contributor's local training in that round; exchange s: the rest;
- coordinator CPU-s per round: user + system time of the coordinator process
  (``/proc/<pid>/stat``) between the first and the last round's close, per round; agent
  CPU-s per round the same for each agent, their mean;
- coordinator and agent peak RSS (``VmHWM``, polled until the process exits) over the
  model's float32 bytes; the agents' figure is the largest of them, each agent's the
  largest of its process and its rank processes (an agent on CUDA trains in a child; CPU
  seconds count the family too). The task's optimizer
  is plain SGD, so an agent holds no optimizer state;
- checkpoint ms: how long the round waited for its checkpoint once its downlink was
  encoded (``on path``) and how long the file took from its first tensor to being whole
  (``write``; it is written while the downlink is encoded and sent), from the
  coordinator's ``[Coordinator.Checkpoint]`` log lines; without them (a coordinator from
  before them, which saved before the broadcast) the write is timed from the
  checkpoint's temporary file appearing to its rename, all of it on the path.

``--replicas 0,1,2`` runs the coordinator as that many replicas, one run each (0: one
coordinator, no election, the default; 1: a replica elected through a local etcd, with
no standby; 2: a leader and one standby that replays its rounds, docs/failover.md): the
standby's CPU-s per round and peak RSS, and the release's medians (the wait for the
standby's ack once the leader's checkpoint is written, the etcd write) come as four more
columns, and the round figures show what following costs the leader.

``--phases`` runs every process at DEBUG and adds, per size and codec, where a round's
time went along its critical path (``bench/phases.py``: the previous broadcast's apply,
training, encode, upload, the coordinator's close, with their parts).

The last line is ``100M fp16: exchange X.X s, coordinator RSS X.Xx, agent RSS X.Xx`` (or
the largest size and first codec measured). ``--record WHAT`` also writes the run to
``bench/results/<date>-scale-<WHAT>.md`` with the command, commit and host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import phases  # bench/phases.py, beside this script
from results_file import record  # bench/results_file.py, beside this script

from skyfed.certs.testing import make_federation
from skyfed.coordinator.admin import fetch_status
from skyfed.coordinator.replicas.testing import EtcdServer
from skyfed.procs import Children, command, wait_for_file
from skyfed.tasks import load_task
from skyfed.tasks.examples import parse_size

CLOUDS = ("aws", "gcp", "azure", "oci", "ibm", "alibaba", "ovh", "hetzner")
TASK = "skyfed.tasks.examples:wide"
POLL_S = 0.02
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CHECKPOINT_LOG = re.compile(r"\[Coordinator\.Checkpoint\] round=(\d+) on_path_ms=([\d.]+)")
CHECKPOINT_WRITE_LOG = re.compile(r"\[Coordinator\.Checkpoint\] round=(\d+) written_ms=([\d.]+)")
RELEASE_LOG = re.compile(
    r"\[Coordinator\.Release\] round=(\d+) standbys=\d+ ack_wait_ms=([\d.]+) etcd_ms=([\d.]+)"
)


@dataclass(slots=True)
class Row:
    params: int
    codec: str
    round_s: float = float("nan")
    train_s: float = float("nan")
    exchange_s: float = float("nan")
    cpu_s: float = float("nan")
    agent_cpu_s: float = float("nan")
    """CPU seconds per round of an agent, the mean over the agents."""
    coordinator_rss: float = float("nan")
    """Peak RSS over the model's float32 bytes."""
    agent_rss: float = float("nan")
    on_path_ms: float = float("nan")
    write_ms: float = float("nan")
    rounds: int = 0
    stage: str = ""
    """The coordinator's ``--stage-memory`` ("": its default)."""
    replicas: int = 0
    """Coordinator replicas (0: one coordinator, no election)."""
    standby_cpu_s: float = float("nan")
    """CPU seconds per round of the standby replica (``replicas`` 2)."""
    standby_rss: float = float("nan")
    ack_wait_ms: float = float("nan")
    """How long the round's end waited for the standby's ack once the leader's own
    checkpoint was written (a replica's ``[Coordinator.Release]`` lines)."""
    etcd_ms: float = float("nan")
    """How long recording the release in etcd took."""
    phases: phases.Breakdown | None = None
    """Where the rounds' time went (``--phases``)."""


@dataclass(slots=True)
class Watch:
    """What a polling thread sees of the processes while they run."""

    hwm: dict[str, int] = field(default_factory=dict)
    """Process name -> the last VmHWM read, bytes."""
    cpu_at_round: dict[int, dict[str, float]] = field(default_factory=dict)
    """Rounds closed -> each process's CPU seconds when the status file first said so."""
    writes_ms: list[float] = field(default_factory=list)


def family(pid: int) -> list[int]:
    """``pid`` and its live descendants: an agent on CUDA (or with ``tp`` > 1) trains in
    rank processes of its own, whose memory and CPU are the agent's."""
    pids, i = [pid], 0
    while i < len(pids):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pids[i]}/task").iterdir():
                pids += [int(c) for c in (task / "children").read_text().split()]
        i += 1
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid``'s family."""
    total = 0.0
    for member in family(pid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime, ticks
    return total


def peak_rss(pid: int) -> int:
    """The largest VmHWM in ``pid``'s family, bytes."""
    peak = 0
    for member in family(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
    return peak


def watch(
    kids: Children, status_file: Path, ckpt_dir: Path, stop: threading.Event
) -> tuple[Watch, threading.Thread]:
    """Poll every ``POLL_S`` until ``stop``: peak RSS, CPU at each round's close, writes."""
    seen = Watch()

    def loop() -> None:
        tmp_since: float | None = None
        while not stop.is_set():
            for name, proc in list(kids.procs.items()):
                if proc.poll() is None:
                    with contextlib.suppress(OSError, ValueError):
                        seen.hwm[name] = max(seen.hwm.get(name, 0), peak_rss(proc.pid))
            coordinator = kids.procs["coordinator"]
            try:
                closed = len(json.loads(status_file.read_text())["rounds"])
                if closed not in seen.cpu_at_round and coordinator.poll() is None:
                    seen.cpu_at_round[closed] = {
                        name: cpu_seconds(proc.pid)
                        for name, proc in kids.procs.items()
                        if proc.poll() is None
                    }
            except (OSError, ValueError, KeyError):
                pass
            writing = any(ckpt_dir.glob(".ckpt-*.tmp")) if ckpt_dir.exists() else False
            if writing and tmp_since is None:
                tmp_since = time.monotonic()
            elif not writing and tmp_since is not None:
                seen.writes_ms.append((time.monotonic() - tmp_since) * 1000)
                tmp_since = None
            time.sleep(POLL_S)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return seen, thread


def run(
    params: int,
    codec: str,
    args: argparse.Namespace,
    work: Path,
    stage: str = "",
    replicas: int = 0,
) -> Row:
    spec = f"{TASK}?params={params}"
    certs = work / "certs"
    agents = [(CLOUDS[i % len(CLOUDS)], f"{CLOUDS[i % len(CLOUDS)]}-1") for i in range(args.agents)]
    ca = make_federation(certs, agents)
    status_file, ckpt_dir = work / "status.json", work / "ckpt"
    kids = Children(work / "logs")
    env = {"SKYFED_LOG_LEVEL": "DEBUG"} if args.phases else {}
    stop = threading.Event()
    etcd = None
    try:
        flags = {
            "--certs": certs,
            "--listen": "127.0.0.1:0",
            "--port-file": work / "port",
            "--status-file": status_file,
            "--rounds": args.rounds,
            "--min-agents": args.agents,
            "--task": spec,
            "--codec": codec,
            "--checkpoint-dir": ckpt_dir,
            "--round-deadline-s": 600,
        }
        if args.max_chunk_bytes:
            flags["--max-chunk-bytes"] = args.max_chunk_bytes
        if stage:
            flags["--stage-memory"] = stage
        if replicas:
            etcd = EtcdServer(work / "etcd")
            for name in ("a", "b"):
                ca.issue_coordinator(f"coordinator-{name}", hosts=("localhost", "127.0.0.1"))
            flags.update({"--replica": "a", "--etcd": etcd.url, "--lease-ttl-s": 5})
        coordinator = kids.start("coordinator", command("coordinator", "serve", *_argv(flags)), env)
        seen, watcher = watch(kids, status_file, ckpt_dir, stop)
        port = int(wait_for_file(work / "port", 300, coordinator))
        if replicas >= 2:
            standby = flags | {
                "--replica": "b",
                "--listen": "127.0.0.1:0",
                "--port-file": work / "standby-port",
                "--status-file": work / "standby-status.json",
                "--checkpoint-dir": work / "ckpt-standby",
            }
            kids.start("standby", command("coordinator", "serve", *_argv(standby)), env)
            _wait_following(port, certs, "b")
        for i, (cloud, name) in enumerate(agents):
            agent = {
                "--cloud": cloud,
                "--name": name,
                "--coordinator": f"localhost:{port}",
                "--certs": certs,
                "--task": spec,
                "--shard": i,
                "--num-shards": args.agents,
                "--local-steps": args.local_steps,
                "--report": work / f"{name}.json",
            }
            if args.device:
                agent["--device"] = args.device
            kids.start(name, command("agent", "start", *_argv(agent)), env)
        deadline = time.monotonic() + args.timeout_s
        for name in ["coordinator", *(n for _, n in agents)]:
            code = kids.procs[name].wait(timeout=max(1.0, deadline - time.monotonic()))
            if code != 0:
                raise RuntimeError(f"{name} exited {code}:\n{kids.log(name)[-3000:]}")
        stop.set()
        watcher.join()
        row = _row(params, codec, args, work, seen, kids, agents)
        row.stage, row.replicas = stage, replicas
        if args.phases:
            names = [n for _, n in agents]
            row.phases = phases.breakdown({n: kids.log(n) for n in ["coordinator", *names]}, names)
        return row
    finally:
        stop.set()
        kids.stop_all()
        if etcd is not None:
            etcd.stop()


def _wait_following(port: int, certs: Path, replica: str, timeout_s: float = 300) -> None:
    """Until the leader streams its rounds to ``replica`` (it attached; it follows from the
    first round it acks)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            status = fetch_status(f"localhost:{port}", certs, "ops", timeout_s=2)
            members = status.replicas.members if status.replicas else []
            if any(m.name == replica and m.state != "standby" for m in members):
                return
        time.sleep(0.5)
    raise RuntimeError(f"replica {replica} did not follow the leader within {timeout_s} s")


def _row(
    params: int,
    codec: str,
    args: argparse.Namespace,
    work: Path,
    seen: Watch,
    kids: Children,
    agents: list[tuple[str, str]],
) -> Row:
    model = sum(p.numel() for p in load_task(f"{TASK}?params={params}").build_model(0).parameters())
    model_bytes = model * 4
    status = json.loads((work / "status.json").read_text())
    rounds = status["rounds"][args.warmup :] or status["rounds"]
    digests = {json.loads((work / f"{n}.json").read_text())["weights_digest"] for _, n in agents}
    if digests != {status["weightsDigest"]}:
        raise RuntimeError(f"agents differ from the coordinator at {params} {codec}: {digests}")
    row = Row(params, codec, rounds=len(status["rounds"]))
    row.round_s = statistics.median(r["durationS"] for r in rounds)
    row.train_s = statistics.median(r.get("trainS", 0.0) for r in rounds)
    row.exchange_s = statistics.median(r["durationS"] - r.get("trainS", 0.0) for r in rounds)
    marks = sorted(seen.cpu_at_round.items())
    marks = [(n, c) for n, c in marks if n >= args.warmup]
    if len(marks) >= 2:
        (n0, c0), (n1, c1) = marks[0], marks[-1]
        row.cpu_s = (c1["coordinator"] - c0["coordinator"]) / (n1 - n0)
        if "standby" in c0 and "standby" in c1:
            row.standby_cpu_s = (c1["standby"] - c0["standby"]) / (n1 - n0)
        per_agent = [
            (c1[name] - c0[name]) / (n1 - n0) for _, name in agents if name in c0 and name in c1
        ]
        row.agent_cpu_s = statistics.mean(per_agent) if per_agent else float("nan")
    row.coordinator_rss = seen.hwm.get("coordinator", 0) / model_bytes
    row.agent_rss = max(seen.hwm.get(n, 0) for _, n in agents) / model_bytes
    if "standby" in seen.hwm:
        row.standby_rss = seen.hwm["standby"] / model_bytes
    log = kids.log("coordinator")
    released = [m for m in RELEASE_LOG.finditer(log) if int(m.group(1)) >= args.warmup]
    if released:
        row.ack_wait_ms = statistics.median(float(m.group(2)) for m in released)
        row.etcd_ms = statistics.median(float(m.group(3)) for m in released)
    on_path = [float(m.group(2)) for m in CHECKPOINT_LOG.finditer(log)]
    written = [float(m.group(2)) for m in CHECKPOINT_WRITE_LOG.finditer(log)]
    if written:
        row.write_ms = statistics.median(written)
        row.on_path_ms = statistics.median(on_path) if on_path else float("nan")
    elif seen.writes_ms:
        row.write_ms = statistics.median(seen.writes_ms)
        row.on_path_ms = row.write_ms  # saved before the broadcast: all of it on the path
    return row


def _argv(flags: dict[str, object]) -> list[str]:
    return [str(x) for kv in flags.items() for x in kv]


def size_text(n: int) -> str:
    return f"{n // 10**6}M" if n >= 10**6 else f"{n // 10**3}k"


REPLICAS = {0: "", 1: ", 1 replica (etcd), no standby", 2: ", leader + 1 standby"}


def table(rows: list[Row]) -> list[str]:
    standbys = any(r.replicas for r in rows)
    extra = (
        " standby CPU-s/round | standby peak RSS / model | release: ack wait ms | etcd ms |"
        if standbys
        else ""
    )
    lines = [
        "| params | codec | round s | training s | exchange s | coordinator CPU-s/round "
        "| agent CPU-s/round | coordinator peak RSS / model | agent peak RSS / model "
        f"| checkpoint on path ms | checkpoint write ms |{extra}",
        "|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * (4 if standbys else 0),
    ]
    for r in rows:
        cells = ""
        if standbys and r.replicas >= 2:
            cells = f" {r.standby_cpu_s:.2f} | {r.standby_rss:.1f}x |"
        elif standbys:
            cells = " - | - |"
        if standbys:
            cells += f" {r.ack_wait_ms:.0f} | {r.etcd_ms:.0f} |" if r.replicas else " - | - |"
        lines.append(
            f"| {size_text(r.params)} | {r.codec}{f', stage_memory {r.stage}' if r.stage else ''}"
            f"{REPLICAS[r.replicas]} "
            f"| {r.round_s:.2f} | {r.train_s:.2f} "
            f"| {r.exchange_s:.2f} | {r.cpu_s:.2f} | {r.agent_cpu_s:.2f} "
            f"| {r.coordinator_rss:.1f}x "
            f"| {r.agent_rss:.1f}x | {r.on_path_ms:.0f} | {r.write_ms:.0f} |{cells}"
        )
    return lines


def last_line(rows: list[Row]) -> str:
    pick = next((r for r in rows if r.params == 100_000_000 and r.codec == "fp16"), None)
    if pick is None:
        pick = max(rows, key=lambda r: r.params)
    return (
        f"{size_text(pick.params)} {pick.codec}: exchange {pick.exchange_s:.1f} s, "
        f"coordinator RSS {pick.coordinator_rss:.1f}x, agent RSS {pick.agent_rss:.1f}x"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default="1M,10M,25M,100M", help="Model sizes, k/M suffixes.")
    parser.add_argument("--codecs", default="fp16,topk", help="Fixed codecs, one run each.")
    parser.add_argument("--agents", type=int, default=3, help=f"Agents, 1..{len(CLOUDS)}.")
    parser.add_argument("--rounds", type=int, default=5, help="Rounds per run.")
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="Rounds the medians and CPU-s skip (default 1); 3 skips the rounds whose "
        "checkpoints are new files (docs/scale.md, Checkpoints).",
    )
    parser.add_argument("--timeout-s", type=float, default=900.0, help="Per run.")
    parser.add_argument(
        "--record", metavar="WHAT", help="Also write bench/results/<date>-scale-WHAT.md."
    )
    parser.add_argument("--keep", type=Path, help="Keep each run's directory (logs) under here.")
    parser.add_argument(
        "--local-steps", type=int, default=1, help="Agents' local steps per round (default 1)."
    )
    parser.add_argument(
        "--max-chunk-bytes",
        type=int,
        default=0,
        help="The coordinator's chunk bound, both directions (0: its default).",
    )
    parser.add_argument(
        "--stage-memory",
        default="",
        help="The coordinator's --stage-memory, one run each (comma-separated, e.g. inf,1; "
        "default: its own default).",
    )
    parser.add_argument(
        "--replicas",
        default="0",
        help="Coordinator replicas, one run each (comma-separated, e.g. 0,1,2; 0: one "
        "coordinator; 2: a leader and a standby replaying its rounds).",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="Where the agents train (default: their own, cpu without a GPU); cuda puts "
        "every agent on GPU 0 (docs/scale.md, on an H200 host).",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="Run every process at DEBUG and print where each round's time went (bench/phases.py).",
    )
    args = parser.parse_args(argv)
    raw = sys.argv[1:] if argv is None else argv
    try:
        sizes = [parse_size(s) for s in args.params.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    if not 1 <= args.agents <= len(CLOUDS) or args.rounds < 3:
        parser.error(f"--agents must be 1..{len(CLOUDS)} and --rounds >= 3")
    if not 1 <= args.warmup <= args.rounds - 2:
        parser.error("--warmup must be 1..--rounds - 2 (CPU-s needs two rounds after it)")
    stages = [s.strip() for s in args.stage_memory.split(",")]  # [""]: the default once
    counts = [int(n) for n in args.replicas.split(",")]
    if not all(n in REPLICAS for n in counts):
        parser.error(f"--replicas takes {sorted(REPLICAS)}")
    rows = []
    runs = [(z, c, s, n) for z in sizes for c in codecs for s in stages for n in counts]
    for size, codec, stage, replicas in runs:
        with tempfile.TemporaryDirectory(prefix="skyfed-scale-") as tmp:
            name = f"{size_text(size)}-{codec}" + (f"-stage{stage}" if stage else "")
            name += f"-replicas{replicas}" if replicas else ""
            work = Path(tmp) if args.keep is None else args.keep / name
            work.mkdir(parents=True, exist_ok=True)
            started = time.monotonic()
            rows.append(run(size, codec, args, work, stage, replicas))
            print(
                f"{name}: done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True
            )
    lines = [
        f"{args.agents} agents, {args.rounds} rounds, --local-steps {args.local_steps}, "
        f"loopback{', agents on cuda' if args.device == 'cuda' else ''}; "
        f"medians over rounds {args.warmup}..",
        "",
        *table(rows),
        "",
    ]
    for r in rows:
        if r.phases is not None:
            lines += [*phases.table(r.phases, f"{size_text(r.params)} {r.codec}"), ""]
    lines.append(last_line(rows))
    print("\n".join(lines))
    if args.record:
        print(f"recorded in {record('scale', args.record, raw, lines)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

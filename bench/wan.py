"""skyfed over WAN links: exchange time against the link's physical floor, in the network lab.

    sudo flock /tmp/skyfed-heavy.lock python bench/wan.py --quick --record quick
    sudo python bench/wan.py --profiles cross-region --codecs topk --cc cubic,bbr
    sudo python bench/wan.py --check-under-load --record lab-under-load

Every run builds a lab (lab/topology.py) with a coordinator and 3 agents (``aws-1``,
``gcp-1``, ``azure-1``), every agent on its own link of one profile, and runs the real
``coordinator serve`` and ``agent start`` (mTLS, a throwaway CA) on
``skyfed.tasks.examples:wide?params=10M`` with one fixed codec for ``--rounds`` rounds.
The congestion control is set per route on both ends (``PROFILE+bbr``, docs/wan.md).
Per run it prints medians over the rounds after the first:

- training s: the slowest contributor's local training (the coordinator's ``train_s``);
- exchange s: the round's duration minus its training (upload, aggregate, broadcast, apply);
- floor s: one round trip plus a link's bytes up and down at the profile's rate (for
  ``lan``, which has no rate, at the lab's TCP ceiling measured in the same run);
- round s: the round's duration as the coordinator reports it;
- bare TCP s: one fresh plain TCP connection moving the same bytes up, then another down,
  on aws-1's link in the same lab after the federation finished (same congestion control);
- warm TCP s: after it, on every agent's link at once, one mutual-TLS connection each
  with the federation's certificates, kept open: per round each agent's end sends a
  link's upload bytes and the coordinator's end answers every one with its broadcast
  bytes once all are in, ``WARM_ROUNDS`` rounds (the federation's timed rounds, if more)
  a training's median apart after ``WARM_UP`` untimed ones; a round is its slowest
  agent's, and the column their median.
  What the links (their loss recovery included, and the round's wait for the slowest)
  and TLS on this host take for a round's bytes on connections as warm as a session's:
  the reference for skyfed's share of an exchange. (Before 2026-12-04 it was one link's
  connection alone, which leaves out the wait for the slowest of three lossy links.)

``--streams auto`` (the default) runs at the coordinator's default N (the monitor's
choice once striped sessions are there, else one stream; the settings say which); a
number bounds N (``--max-streams``; 1 is one plain stream) and needs striped sessions.
``--overlap on`` runs the coordinator's ``--overlap``. ``--tuned on`` sets the host
tuning docs/wan.md gives real hosts, in every lab namespace and on the links' routes:
``net.ipv4.tcp_slow_start_after_idle = 0`` and ``initcwnd``/``initrwnd`` of
``--initcwnd`` segments; ``--tuned off,on`` measures both side by side in one run. The last line is
``worst exchange/floor: X.XXx (<profile>, <settings>)`` over the runs at default settings
(N and overlap at their defaults, BBR: the congestion control docs/wan.md tells hosts to
set). ``--record WHAT`` writes the run to
``bench/results/<date>-wan-<WHAT>.md`` with the command, commit and host.

``--check-under-load`` instead measures every link of a 3-agent lab *at once* with the
lab's self-check (RTT, loss, rate both ways) while that lab's federation trains, which is
when a userspace shaper used to starve (docs/wan.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import phases  # bench/phases.py, beside this script
from results_file import record  # bench/results_file.py, beside this script

from skyfed.lab.federation import Federation, FederationSpec, round_floor_s
from skyfed.lab.netns import why_unavailable
from skyfed.lab.profiles import load_catalog
from skyfed.lab.selfcheck import PROBE_PORT, CheckSettings, measure_ceiling, measure_link
from skyfed.lab.topology import COORDINATOR, AgentSpec, Lab, LabSpec, tear_down_on_signals

AGENTS = ("aws-1", "gcp-1", "azure-1")
PROFILES = ("lan", "far-clean", "cross-region", "transpacific")
TASK = "skyfed.tasks.examples:wide?params={params}"
BARE_PORT = 47100
WARM_PORT = 47101
WARM_UP = 2
"""Untimed rounds that open the warm connection's windows before the timed ones."""
WARM_ROUNDS = 6
"""Timed warm rounds at least; as many as the federation's timed rounds (``--rounds`` - 1)
when it runs more, so both medians rest on as many samples of the same heavy-tailed link."""
DEFAULTS = {"overlap": "off", "cc": "bbr"}
"""The settings the last line's worst case is taken over (see the module docstring)."""


@dataclass(slots=True)
class Row:
    profile: str
    codec: str
    cc: str
    streams: str
    overlap: str
    train_s: float = float("nan")
    exchange_s: float = float("nan")
    floor_s: float = float("nan")
    round_s: float = float("nan")
    bare_s: float = float("nan")
    warm_s: float = float("nan")
    """A round's bytes over warm TLS connections on every link at once (``warm_tcp_s``)."""
    mb_up: float = float("nan")
    """Per link per round, MB."""
    mb_down: float = float("nan")
    rounds: int = 0
    note: str = ""
    default_n: bool = False
    """Ran at the coordinator's default N (``--streams auto``)."""
    late: str = ""
    """Agents cut off by the coordinator's exit (see ``finish``)."""
    sysctls: str = ""
    """Host settings the run changed from the lab's (``--sysctl``), as ``k=v`` words."""
    phases: phases.Breakdown | None = None
    """Where the rounds' time went (``--phases``)."""

    @property
    def settings(self) -> str:
        extra = f", {self.sysctls}" if self.sysctls else ""
        return f"{self.codec}, {self.cc}, N={self.streams}, overlap {self.overlap}{extra}"

    @property
    def ratio(self) -> float:
        return self.exchange_s / self.floor_s if self.floor_s > 0 else float("nan")

    @property
    def warm_ratio(self) -> float:
        return self.exchange_s / self.warm_s if self.warm_s > 0 else float("nan")

    @property
    def default(self) -> bool:
        """At the coordinator's default N (the monitor's, or 1 before striping)."""
        defaults = (DEFAULTS["cc"], DEFAULTS["overlap"])
        return not self.sysctls and self.default_n and (self.cc, self.overlap) == defaults


def coordinator_has(option: str) -> bool:
    """Whether ``coordinator serve`` knows ``option`` (striping and overlap land later)."""
    out = subprocess.run(
        ["coordinator", "serve", "--help"], capture_output=True, text=True, check=False
    )
    return option in out.stdout


IDLE_RESTART = "net.ipv4.tcp_slow_start_after_idle"


def run_one(
    profile: str,
    codec: str,
    cc: str,
    streams: str,
    overlap: str,
    args: argparse.Namespace,
    tuned: bool = False,
) -> Row:
    row = Row(profile, codec, cc, streams, overlap, default_n=streams == "auto")
    sysctls = dict(kv.split("=", 1) for kv in args.sysctl)
    initcwnd = args.initcwnd if tuned else 0
    if tuned:
        sysctls[IDLE_RESTART] = "0"
    words = [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in sysctls.items()]
    row.sysctls = " ".join(words + ([f"initcwnd={initcwnd}"] if initcwnd else []))
    task = TASK.format(params=args.params)
    coord_args = ["--task", task, "--codec", codec]
    striping = coordinator_has("--max-streams")
    if streams == "auto":  # the coordinator's default: the monitor chooses N
        row.streams = "monitor" if striping else "1"
    elif striping:
        coord_args += ["--max-streams", streams]  # N = 1 is the plain path
    elif streams != "1":
        raise SystemExit("--streams other than 1 needs the coordinator's striped sessions")
    if overlap == "on":
        if not coordinator_has("--overlap"):
            raise SystemExit("--overlap on needs the coordinator's --overlap")
        coord_args += ["--overlap"]
    with tempfile.TemporaryDirectory(prefix="skyfed-wan-") as tmp:
        work = Path(tmp) if args.keep is None else args.keep / f"{profile}-{row.settings}"
        work.mkdir(parents=True, exist_ok=True)
        status_file = work / "status.json"
        coord_args += ["--status-file", str(status_file)]
        agent_args = ["--task", task, "--local-steps", str(args.local_steps)]
        spec = FederationSpec(
            rounds=args.rounds,
            round_deadline_s=args.timeout_s,
            coordinator_args=tuple(coord_args),
            agent_args=tuple(agent_args),
        )
        link_profile = f"{profile}+{cc}"
        agents = tuple(AgentSpec(name=a, profile=link_profile) for a in AGENTS)
        with Lab(spec=LabSpec(agents=agents, initcwnd=initcwnd)) as lab:
            for ns in lab.hosts.values():
                ns.set_sysctls(sysctls)
            rate = lab.link(AGENTS[0]).profile.rate_mbit
            rtt = lab.link(AGENTS[0]).profile.rtt_ms
            if not rate:
                rate = measure_ceiling(lab, AGENTS[0])
                row.note = f"lan rate: lab ceiling {rate:.0f} Mbit/s"
            fed = Federation(lab, spec, work)
            fed.start()
            codes = finish(fed, args.timeout_s * args.rounds + 120)
            late = [h for h, c in codes.items() if c is None]
            if late:  # see finish(): the rounds were measured, the agent was cut off
                row.late = f"{profile} {row.settings}: {', '.join(late)} still receiving the "
                row.late += f"last aggregate {30:g} s after the coordinator exited; stopped"
            if any(c not in (0, None) for c in codes.values()) or codes[COORDINATOR] is None:
                tails = "\n".join(f"--- {h}\n{fed.tail(h, 15)}" for h in codes)
                raise RuntimeError(f"{profile} {row.settings}: exit codes {codes}\n{tails}")
            status = json.loads(status_file.read_text())
            rounds = status["rounds"][1:] or status["rounds"]
            row.rounds = len(status["rounds"])
            n = max(1, len(AGENTS))
            up = statistics.median(int(r["bytesUp"]) / n for r in rounds)
            down = statistics.median(int(r["bytesDown"]) / n for r in rounds)
            row.mb_up, row.mb_down = up / 1e6, down / 1e6
            row.round_s = statistics.median(r["durationS"] for r in rounds)
            row.train_s = statistics.median(r.get("trainS", 0.0) for r in rounds)
            row.exchange_s = statistics.median(
                r["durationS"] - r.get("trainS", 0.0) for r in rounds
            )
            row.floor_s = round_floor_s(rtt, rate, up, down)
            if args.phases:
                row.phases = phases.from_dir(work, AGENTS)
            row.bare_s = bare_tcp_s(lab, AGENTS[0], int(up), True) + bare_tcp_s(
                lab, AGENTS[0], int(down), False
            )
            row.warm_s = warm_tcp_s(
                lab,
                fed.certs,
                AGENTS,
                int(up),
                int(down),
                row.train_s,
                rounds=max(WARM_ROUNDS, args.rounds - 1),
            )
    return row


def finish(fed: Federation, timeout_s: float, grace_s: float = 30.0) -> dict[str, int | None]:
    """Wait for the coordinator, then up to ``grace_s`` for the agents; exit codes, None for
    an agent stopped after the grace. A coordinator that has run its rounds exits, and a
    far agent may still be receiving the last aggregate then: without the coordinator it
    would retry its connection forever."""
    assert fed.coordinator is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and fed.coordinator.popen.poll() is None:
        time.sleep(0.2)
    codes = fed.wait(grace_s)
    for host, proc in fed.agent_procs.items():
        if codes[host] is None:
            proc.stop()
    return codes


def bare_tcp_s(lab: Lab, agent: str, nbytes: int, upward: bool) -> float:
    """Seconds one fresh TCP connection takes to move ``nbytes`` over ``agent``'s link."""
    if nbytes <= 0:
        return 0.0
    src, dst = (agent, COORDINATOR) if upward else (COORDINATOR, agent)
    addr = str(lab.address(dst))
    probe = [sys.executable, "-m", "skyfed.lab.probe"]
    sink = subprocess.Popen(
        lab.hosts[dst].exec_argv(
            [*probe, "tcp-sink", "--bind", addr, "--port", str(BARE_PORT), "--duration-s", "600"]
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sink.stdout is not None
        sink.stdout.readline()  # ready
        send = [*probe, "tcp-send", "--to", addr, "--port", str(BARE_PORT), "--bytes", str(nbytes)]
        out = subprocess.run(
            lab.hosts[src].exec_argv([*send, "--duration-s", "600"]),
            capture_output=True,
            text=True,
            check=True,
            timeout=900,
        ).stdout
        return float(json.loads(out.splitlines()[-1])["seconds"])
    finally:
        sink.kill()
        sink.wait()


def warm_tcp_s(
    lab: Lab,
    certs: Path,
    agents: Sequence[str],
    up: int,
    down: int,
    idle_s: float,
    rounds: int = WARM_ROUNDS,
) -> float:
    """Median seconds of a round's bytes over warm mTLS connections, one on each of
    ``agents``' links at once: each sends ``up``, the coordinator's end answers every one
    with ``down`` once all are in (a round's shape: the broadcast waits for the slowest
    upload), ``idle_s`` apart; a round's time is its slowest agent's."""
    addr = str(lab.address(COORDINATOR))
    probe = [sys.executable, "-m", "skyfed.lab.probe"]
    tls = ["--port", str(WARM_PORT), "--certs", str(certs), "--duration-s", "600"]
    server = subprocess.Popen(
        lab.hosts[COORDINATOR].exec_argv(
            [*probe, "tls-respond", "--bind", addr, "--name", COORDINATOR, "--peers"]
            + [str(len(agents)), *tls]
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    clients: list[subprocess.Popen[str]] = []
    try:
        assert server.stdout is not None
        server.stdout.readline()  # ready
        shape = ["--up", str(up), "--down", str(down), "--idle-s", f"{idle_s:.3f}"]
        shape += ["--rounds", str(rounds), "--warmup", str(WARM_UP)]
        for agent in agents:
            argv = [*probe, "tls-rounds", "--to", addr, "--name", agent, *tls, *shape]
            clients.append(
                subprocess.Popen(
                    lab.hosts[agent].exec_argv(argv), stdout=subprocess.PIPE, text=True
                )
            )
        results = []
        for client in clients:
            out, _ = client.communicate(timeout=900)
            if client.returncode != 0:
                raise RuntimeError(f"tls-rounds exited {client.returncode}")
            results.append(json.loads(out.splitlines()[-1]))
        slowest = [
            max(per_round) for per_round in zip(*(r["seconds"] for r in results), strict=True)
        ]
        return timed_median(slowest, results[0]["warmup"])
    finally:
        for proc in (*clients, server):
            proc.kill()
            proc.wait()


def timed_median(seconds: list[float], warmup: int) -> float:
    """The median of the rounds after the first ``warmup`` (NaN if none is left): the warm
    connection's steady state, as the federation's medians skip round 0."""
    timed = seconds[warmup:]
    return statistics.median(timed) if timed else float("nan")


def check_under_load(args: argparse.Namespace) -> list[str]:
    """Self-check every link at once while the lab's federation trains."""
    profile = args.profiles.split(",")[0] if args.profiles else "cross-region"
    agents = tuple(AgentSpec(name=a, profile=profile) for a in AGENTS)
    task = TASK.format(params=args.params)
    lines = [f"{len(AGENTS)} links of {profile}, measured at once while the federation trains:"]
    with (
        tempfile.TemporaryDirectory(prefix="skyfed-wan-check-") as tmp,
        Lab(spec=LabSpec(agents=agents)) as lab,
    ):
        spec = FederationSpec(
            rounds=1,
            round_deadline_s=600,
            coordinator_args=("--task", task, "--codec", "topk"),
            agent_args=("--task", task, "--local-steps", str(args.load_steps)),
        )
        fed = Federation(lab, spec, Path(tmp))
        fed.start()
        time.sleep(args.load_warmup_s)  # agents are up and in their local steps
        load = os.getloadavg()[0]
        reports: dict[str, object] = {}

        def measure(i: int, agent: str) -> None:
            settings = dataclasses.replace(CheckSettings(), port=PROBE_PORT + i)
            reports[agent] = measure_link(lab, agent, settings)

        threads = [threading.Thread(target=measure, args=(i, a)) for i, a in enumerate(AGENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        training = [a for a, p in fed.agent_procs.items() if p.popen.poll() is None]
        lines.append(f"load average at the start: {load:.1f}; agents still training: {training}")
        lines += [reports[a].summary() for a in AGENTS]  # type: ignore[attr-defined]
        ok = all(reports[a].ok for a in AGENTS)  # type: ignore[attr-defined]
        lines.append(f"links passing their self-check under load: {'all' if ok else 'NOT all'}")
    return lines


WINDOW_OPTIONS: dict[str, list[tuple[str, int]]] = {
    "grpc defaults (BDP probe on)": [],
    "BDP probe off": [("grpc.http2.bdp_probe", 0)],
    "max frame 1 MiB": [("grpc.http2.max_frame_size", 1 << 20)],
}
"""Channel and server options tried by --windows (both ends get the same)."""
GRPC_PORT = 47200
MESSAGE = 1 << 20


def grpc_role(role: str, addr: str, options: list[tuple[str, int]], nbytes: int) -> None:
    """Inside a lab host: serve one stream-unary method, or time sending ``nbytes`` to it."""
    from concurrent import futures

    import grpc

    limits = [("grpc.max_receive_message_length", 2 * MESSAGE)]
    if role == "serve":

        def sink(it, _ctx):  # noqa: ANN001, ANN202
            return str(sum(len(m) for m in it)).encode()

        handler = grpc.method_handlers_generic_handler(
            "bench.Wan", {"Sink": grpc.stream_unary_rpc_method_handler(sink)}
        )
        server = grpc.server(futures.ThreadPoolExecutor(4), options=[*limits, *options])
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"{addr}:{GRPC_PORT}")
        server.start()
        print("ready", flush=True)
        server.wait_for_termination(600)
        return
    channel = grpc.insecure_channel(f"{addr}:{GRPC_PORT}", options=[*limits, *options])
    call = channel.stream_unary("/bench.Wan/Sink")
    call(iter([b"w"]))  # connect and warm the channel, as a federation's session is
    block = b"\0" * MESSAGE
    times = []
    for _ in range(2):  # the second transfer starts with the windows the first grew
        start = time.monotonic()
        got = int(call(iter([block] * (nbytes // MESSAGE))))
        times.append(time.monotonic() - start)
        assert got == nbytes // MESSAGE * MESSAGE
    print(json.dumps({"seconds": times}), flush=True)


def windows(args: argparse.Namespace) -> list[str]:
    """One gRPC stream against one bare TCP connection on a high-BDP link, per option set."""
    profile = args.profiles.split(",")[0] if args.profiles else "gigabit-50ms+bbr"
    nbytes = int(args.window_mb * 1e6) // MESSAGE * MESSAGE
    lines = [f"one stream-unary gRPC call of {nbytes / 1e6:.0f} MB over {profile} (insecure):", ""]
    lines += [
        "| options | 1st call s | 2nd call s | Mbit/s (2nd) | bare TCP s |",
        "|---|---|---|---|---|",
    ]
    me = [sys.executable, str(Path(__file__).resolve())]
    with Lab(spec=LabSpec(agents=(AgentSpec(name="aws-1", profile=profile),))) as lab:
        link = lab.link("aws-1").profile
        ceiling = measure_ceiling(lab, "aws-1")
        bare = bare_tcp_s(lab, "aws-1", nbytes, True)
        addr = str(lab.address(COORDINATOR))
        for name, options in WINDOW_OPTIONS.items():
            opt = json.dumps(options)
            role = ["--grpc-role", "serve", "--grpc-addr", addr, "--grpc-options", opt]
            server = subprocess.Popen(
                lab.hosts[COORDINATOR].exec_argv([*me, *role]), stdout=subprocess.PIPE, text=True
            )
            try:
                assert server.stdout is not None
                server.stdout.readline()
                send = ["--grpc-role", "send", "--grpc-addr", addr, "--grpc-options", opt]
                out = subprocess.run(
                    lab.hosts["aws-1"].exec_argv([*me, *send, "--window-mb", str(args.window_mb)]),
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=600,
                ).stdout
            finally:
                server.kill()
                server.wait()
            first, second = json.loads(out.splitlines()[-1])["seconds"]
            lines.append(
                f"| {name} | {first:.2f} | {second:.2f} | {nbytes * 8 / second / 1e6:.0f} "
                f"| {bare:.2f} |"
            )
        rate = min(link.rate_mbit or ceiling, ceiling)
        bdp_mb = rate * 1e6 / 8 * link.rtt_ms / 1000 / 1e6
        lines += [
            "",
            f"link {link.rtt_ms:g} ms x {link.rate_mbit:g} Mbit/s ({link.congestion}); lab TCP "
            f"ceiling {ceiling:.0f} Mbit/s; BDP at the lesser of the two {bdp_mb:.2f} MB",
        ]
    return lines


def single_stream(args: argparse.Namespace) -> list[str]:
    """Goodput of one TCP stream per profile and congestion control, with the sender's view."""
    profiles = (args.profiles or "cross-region,transpacific").split(",")
    lines = ["| profile | congestion control | goodput Mbit/s | sender's `ss -ti` mid-run |"]
    lines.append("|---|---|---|---|")
    for profile in profiles:
        for cc in args.cc.split(","):
            with Lab(
                spec=LabSpec(agents=(AgentSpec(name="aws-1", profile=f"{profile}+{cc}"),))
            ) as lab:
                seen: list[str] = []

                def look(lab: Lab = lab, seen: list[str] = seen) -> None:
                    time.sleep(args.stream_s * 0.6)
                    ss = lab.hosts["aws-1"].exec_argv(
                        ["ss", "-tin", "dst", str(lab.address(COORDINATOR))]
                    )
                    out = subprocess.run(ss, capture_output=True, text=True, check=False).stdout
                    info = out.splitlines()[-1].split() if out.strip() else []
                    keep = ("cubic", "bbr", "cwnd:", "delivery_rate", "retrans:", "bbr:(")
                    seen.append(" ".join(w for w in info if w.startswith(keep)))

                watcher = threading.Thread(target=look)
                watcher.start()
                mbit = measure_ceiling(lab, "aws-1", duration_s=args.stream_s)
                watcher.join()
                lines.append(f"| {profile} | {cc} | {mbit:.1f} | `{seen[0] if seen else ''}` |")
    return [
        f"one TCP stream, agent to coordinator, {args.stream_s:g} s (slow start included):",
        "",
        *lines,
    ]


def table(rows: list[Row]) -> list[str]:
    """With overlap a round's training and exchange run at once, so its exchange s (round
    minus training) is not the exchange's time: those rows show ``round / max(training,
    exchange)`` instead, the exchange taken from the same run without overlap. ``lan
    exchange`` (same codec and congestion control) is what the exchange costs where the
    network costs next to nothing: the CPU's floor on this host (codec, TLS, aggregation,
    every process on the same cores)."""
    lines = [
        "| profile | settings | MB up/down per link | training s | exchange s | floor s "
        "| exchange/floor | round s | bare TCP s | warm TCP s | exchange / warm TCP "
        "| exchange / max(floor, lan exchange) | round / max(training, exchange) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lan = next(
            (o for o in rows if o.profile == "lan" and o.overlap == "off" and _same(o, r, True)),
            None,
        )
        cpu = f"{r.exchange_s / max(r.floor_s, lan.exchange_s):.2f}x" if lan else ""
        if r.overlap == "on":
            sibling = next((o for o in rows if o.overlap == "off" and _same(o, r)), None)
            bound = (
                f"{r.round_s / max(r.train_s, sibling.exchange_s):.2f}x"
                if sibling
                else "(no overlap-off row in this run)"
            )
            lines.append(
                f"| {r.profile} | {r.settings} | {r.mb_up:.2f}/{r.mb_down:.2f} | {r.train_s:.2f} "
                f"| (overlapped) | {r.floor_s:.2f} | | {r.round_s:.2f} | {r.bare_s:.2f} "
                f"| {r.warm_s:.2f} | | | {bound} |"
            )
            continue
        lines.append(
            f"| {r.profile} | {r.settings} | {r.mb_up:.2f}/{r.mb_down:.2f} | {r.train_s:.2f} "
            f"| {r.exchange_s:.2f} | {r.floor_s:.2f} | {r.ratio:.2f}x | {r.round_s:.2f} "
            f"| {r.bare_s:.2f} | {r.warm_s:.2f} | {r.warm_ratio:.2f}x | {cpu} | |"
        )
    return lines


def _same(a: Row, b: Row, any_profile: bool = False) -> bool:
    """Same settings (and profile, unless ``any_profile``)."""
    same = (a.codec, a.cc, a.streams, a.sysctls) == (b.codec, b.cc, b.streams, b.sysctls)
    return same and (any_profile or a.profile == b.profile)


def far_worst_line(rows: list[Row]) -> list[str]:
    """The worst at default settings off ``lan``: there the floor is milliseconds and the
    ratio measures the host's CPU, not the link."""
    far = [r for r in rows if r.default and r.profile != "lan"]
    if not far or len(far) == len([r for r in rows if r.default]):
        return []
    worst = max(far, key=lambda r: r.ratio)
    return [
        f"worst exchange/floor of a far link: {worst.ratio:.2f}x ({worst.profile}, {worst.settings})"
    ]


def warm_worst_line(rows: list[Row]) -> list[str]:
    """The worst exchange against warm TCP at default settings off ``lan`` (there both are
    the host's CPU): how far skyfed is from what the link itself gives a warm connection."""
    far = [r for r in rows if r.default and r.profile != "lan" and r.warm_s > 0]
    if not far:
        return []
    worst = max(far, key=lambda r: r.warm_ratio)
    return [
        f"worst exchange/warm TCP of a far link: {worst.warm_ratio:.2f}x "
        f"({worst.profile}, {worst.settings})"
    ]


def worst_line(rows: list[Row]) -> str:
    """The worst exchange against its floor at default settings (else of every run without
    overlap): an overlapped round has no exchange of its own to compare."""
    picked = [r for r in rows if r.default] or [r for r in rows if r.overlap == "off"]
    if not picked:
        return "worst exchange/floor: none measured (every run overlapped: add --overlap off)"
    worst = max(picked, key=lambda r: r.ratio)
    return f"worst exchange/floor: {worst.ratio:.2f}x ({worst.profile}, {worst.settings})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profiles", help="Default: lan,far-clean,cross-region,transpacific.")
    parser.add_argument("--codecs", default="fp16,topk")
    parser.add_argument("--cc", default="cubic,bbr", help="Congestion controls, one run each.")
    parser.add_argument(
        "--streams",
        default="auto",
        help="N per run, comma-separated: auto (the coordinator's default: the monitor's N), "
        "or a bound on N (1: one plain stream).",
    )
    parser.add_argument("--overlap", default="off", help="off, on, or off,on.")
    parser.add_argument("--params", default="10M", help="Model size of the wide task.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds per run (medians skip 0).")
    parser.add_argument(
        "--local-steps", type=int, default=16, help="About as long as a far link's exchange."
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="Per round.")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fp16 with CUBIC only on clean profiles (it crawls on lossy ones), overlap only "
        "with BBR.",
    )
    parser.add_argument(
        "--sysctl",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Set this in every lab namespace (net.ipv4.tcp_slow_start_after_idle=0).",
    )
    parser.add_argument(
        "--tuned",
        default="off",
        help="off, on, or off,on: on sets tcp_slow_start_after_idle = 0 and --initcwnd "
        "(docs/wan.md's host tuning) in the lab.",
    )
    parser.add_argument(
        "--initcwnd",
        type=int,
        default=32,
        help="Initial windows (segments) of the links' routes with --tuned on.",
    )
    parser.add_argument("--check-under-load", action="store_true")
    parser.add_argument("--windows", action="store_true", help="HTTP/2 windows on a high BDP.")
    parser.add_argument("--single-stream", action="store_true", help="One TCP stream per CC.")
    parser.add_argument("--stream-s", type=float, default=8.0)
    parser.add_argument("--window-mb", type=float, default=64.0)
    parser.add_argument("--grpc-role", choices=["serve", "send"], help=argparse.SUPPRESS)
    parser.add_argument("--grpc-addr", help=argparse.SUPPRESS)
    parser.add_argument("--grpc-options", default="[]", help=argparse.SUPPRESS)
    parser.add_argument("--load-warmup-s", type=float, default=20.0)
    parser.add_argument("--load-steps", type=int, default=600, help="Local steps while checking.")
    parser.add_argument("--record", metavar="WHAT")
    parser.add_argument("--keep", type=Path, help="Keep each run's directory (logs) here.")
    parser.add_argument(
        "--phases",
        action="store_true",
        help="Run every process at DEBUG and print where each run's rounds went (bench/phases.py).",
    )
    args = parser.parse_args(argv)
    raw = sys.argv[1:] if argv is None else argv
    if args.grpc_role:
        options = [tuple(o) for o in json.loads(args.grpc_options)]
        grpc_role(
            args.grpc_role, args.grpc_addr, options, int(args.window_mb * 1e6) // MESSAGE * MESSAGE
        )
        return 0
    reason = why_unavailable()
    if reason:
        parser.exit(2, f"bench/wan.py: {reason}\n")
    tear_down_on_signals()
    if args.phases:  # the lab's processes inherit it (ip netns exec keeps the environment)
        os.environ["SKYFED_LOG_LEVEL"] = "DEBUG"
    if args.check_under_load:
        lines = check_under_load(args)
    elif args.windows:
        lines = windows(args)
    elif args.single_stream:
        lines = single_stream(args)
    else:
        catalog = load_catalog()
        profiles = [p for p in (args.profiles or ",".join(PROFILES)).split(",") if p]
        for p in profiles:
            catalog.profile(p)  # unknown names fail before any run
        if not set(args.tuned.split(",")) <= {"off", "on"}:
            parser.exit(2, f"bench/wan.py: --tuned {args.tuned!r}: off, on or off,on\n")
        rows = []
        for profile in profiles:
            lossy = catalog.profile(profile).loss_pct > 0
            for codec in args.codecs.split(","):
                for cc in args.cc.split(","):
                    if args.quick and lossy and cc == "cubic" and codec == "fp16":
                        continue
                    for streams, overlap, tuned in itertools.product(
                        args.streams.split(","), args.overlap.split(","), args.tuned.split(",")
                    ):
                        if args.quick and overlap == "on" and cc != DEFAULTS["cc"]:
                            continue
                        started = time.monotonic()
                        row = run_one(profile, codec, cc, streams, overlap, args, tuned == "on")
                        rows.append(row)
                        # An overlapped row's exchange is hidden in its round (the table
                        # bounds the round by its sibling's exchange): show the round.
                        figure = (
                            f"round {row.round_s:.2f} s (overlapped)"
                            if overlap == "on"
                            else f"{row.ratio:.2f}x"
                        )
                        print(
                            f"{profile} {row.settings}: {figure} "
                            f"in {time.monotonic() - started:.0f} s",
                            file=sys.stderr,
                            flush=True,
                        )
        notes = sorted({r.note for r in rows if r.note}) + [r.late for r in rows if r.late]
        lines = [
            f"{len(AGENTS)} agents, {args.params} params, {args.rounds} rounds, "
            f"--local-steps {args.local_steps}; medians over rounds 1..",
            "",
            *table(rows),
            "",
            *notes,
        ]
        for r in rows:
            if r.phases is not None:
                lines += [*phases.table(r.phases, f"{r.profile}, {r.settings}"), ""]
        lines += [*warm_worst_line(rows), *far_worst_line(rows), worst_line(rows)]
    print("\n".join(lines))
    if args.record:
        print(f"recorded in {record('wan', args.record, raw, lines)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

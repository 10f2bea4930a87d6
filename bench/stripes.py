"""One link's exchange goodput at a fixed N of striped connections, and at the monitor's N.

    sudo python bench/stripes.py                               # cross-region, N = 1..32, auto
    sudo python bench/stripes.py --profile transpacific --streams 1,4,16 --rounds 4
    sudo python bench/stripes.py --task 'skyfed.tasks.examples:wide?params=1M' \
        --max-chunk-bytes 65536 --streams 1,16,auto,auto-norate --rounds 6
    python bench/stripes.py --loopback --streams 1,4,16  # no lab: what striping costs in CPU
    sudo python bench/stripes.py --task 'skyfed.tasks.examples:wide?params=1M' \
        --max-chunk-bytes 65536 --streams 1,auto --rounds 6 \
        --notsent-lowat 4294967295,131072,32768   # the send-buffer bound, side by side

Builds a network lab (root, network namespaces) with one agent on ``--profile`` and, for
each N, runs a federation of ``--rounds`` rounds of FP32 chargpt (548 kB each way a round)
with its streams fixed at N (``[streams] min_streams = max_streams = N``), or, for
``auto``, chosen by the monitor up to ``--max-streams`` (``auto`` with the link's rate
given as ``--link-rate-mbit``, ``auto-norate`` without it: Mathis's cap alone).
``--task`` and ``--max-chunk-bytes`` make transfers large enough to be past slow start
and cut into enough chunks for N streams (docs/striping.md). Each agent times its exchanges
(``docs/striping.md``); the table gives, over the rounds after the first, the median
goodput of the exchange (its bytes over its time), the median exchange, its floor at the
profile's rate and their ratio, and the N the rounds ran on. The measurement behind the
default ``max_streams``. ``--loopback`` runs the same on 127.0.0.1 without a lab: no
loss, no delay, so the goodput is what this host's CPUs allow at each N.
``--notsent-lowat`` runs every N once per value of ``net.ipv4.tcp_notsent_lowat``, set in
the lab's namespaces (the lab's own is ``skyfed.netinfo.STRIPED_NOTSENT_LOWAT``;
``docs/striping.md#send-buffers``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from skyfed.certs.testing import make_federation
from skyfed.lab.federation import Federation, FederationSpec
from skyfed.lab.profiles import load_catalog
from skyfed.lab.selfcheck import check_lab
from skyfed.lab.topology import COORDINATOR, AgentSpec, Lab, LabSpec
from skyfed.procs import children, command, wait_for_file

AGENT = "aws-1"


def run(lab: Lab, streams: str, args: argparse.Namespace, work: Path, port: int) -> dict:
    """One federation at ``streams`` (a number, or ``auto``); its timed exchanges."""
    work.mkdir()
    config, status = streams_config(streams, args, work), work / "status.json"
    rate = lab.link(AGENT).profile.rate_mbit if streams != "auto-norate" else 0
    task = ("--task", args.task) if args.task else ()
    chunks = ("--max-chunk-bytes", str(args.max_chunk_bytes)) if args.max_chunk_bytes else ()
    spec = FederationSpec(
        rounds=args.rounds,
        round_deadline_s=600.0,
        port=port,
        coordinator_args=(
            *("--config", str(config), "--codec", "fp32", "--status-file", str(status)),
            *(("--link-rate-mbit", str(rate)) if rate else ()),
            *task,
            *chunks,
        ),
        agent_args=("--max-streams", "64", *task),  # the coordinator's bound decides
    )
    fed = Federation(lab, spec, work)
    fed.start()
    codes = fed.wait(timeout_s=args.timeout_s)
    if any(code != 0 for code in codes.values()):
        tails = "\n".join(f"--- {h}\n{fed.tail(h)}" for h in (COORDINATOR, AGENT))
        raise SystemExit(f"N={streams}: exit codes {codes}\n{tails}")
    links = [link for r in json.loads(status.read_text())["rounds"] for link in r["links"]]
    return {"streams": streams, "links": [x for x in links if int(x["round"]) >= 1]}


def streams_config(streams: str, args: argparse.Namespace, work: Path) -> Path:
    auto = streams.startswith("auto")
    least, most = ("1", args.max_streams) if auto else (streams, streams)
    config = work / "coordinator.toml"
    config.write_text(f"[streams]\nmin_streams = {least}\nmax_streams = {most}\n")
    return config


def run_loopback(streams: str, args: argparse.Namespace, work: Path, certs: Path) -> dict:
    """One federation at ``streams`` on 127.0.0.1, as processes."""
    work.mkdir()
    config, status, port_file = streams_config(streams, args, work), work / "s.json", work / "p"
    serve = ["serve", "--listen", "127.0.0.1:0", "--port-file", str(port_file)]
    serve += ["--certs", str(certs), "--rounds", str(args.rounds), "--config", str(config)]
    serve += ["--codec", "fp32", "--status-file", str(status)]
    agent = ["start", "--cloud", "aws", "--certs", str(certs), "--rounds", str(args.rounds)]
    agent += ["--max-streams", "64"]
    with children(work / "logs") as kids:
        coordinator = kids.start("coordinator", command("coordinator", *serve))
        port = wait_for_file(port_file, 60, coordinator)
        kids.start(AGENT, command("agent", *agent, "--coordinator", f"localhost:{port}"))
        if coordinator.wait(timeout=args.timeout_s) != 0:
            raise SystemExit(f"N={streams}: {kids.log('coordinator')[-3000:]}")
    links = [link for r in json.loads(status.read_text())["rounds"] for link in r["links"]]
    return {"streams": streams, "links": [x for x in links if int(x["round"]) >= 1]}


def row(result: dict) -> str:
    links = result["links"]
    if not links:
        return f"| {result['streams']} | - | - | - | - | - |"

    def med(key: str) -> float:
        return statistics.median(float(x[key]) for x in links)  # JSON writes nan as "NaN"

    used = ",".join(str(n) for n in sorted({x["streams"] for x in links}))
    return (
        f"| {result['streams']} | {used} | {med('goodputMbit'):.1f} | {med('exchangeS'):.2f} "
        f"| {med('floorS'):.2f} | {med('ratio'):.1f}x |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="cross-region")
    parser.add_argument("--streams", default="1,2,4,8,16,32,auto", help="N per run, or auto.")
    parser.add_argument("--max-streams", default="16", help="The bound of the auto runs.")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--task", help="The task of coordinator and agent (default chargpt).")
    parser.add_argument("--max-chunk-bytes", type=int, help="The coordinator's chunk size.")
    parser.add_argument("--timeout-s", type=float, default=420.0)
    parser.add_argument("--loopback", action="store_true", help="127.0.0.1, no lab, no root.")
    parser.add_argument(
        "--notsent-lowat", help="Comma-separated tcp_notsent_lowat values: every N at each."
    )
    args = parser.parse_args()
    load_catalog().profile(args.profile)  # a clear error for an unknown profile
    spec = LabSpec(agents=(AgentSpec(name=AGENT, profile=args.profile),))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"bench/stripes.py {' '.join(sys.argv[1:])}  commit {commit}")
    header = "| N | ran on | goodput Mbit/s | exchange s | floor s | exchange / floor |"
    if args.loopback:
        with tempfile.TemporaryDirectory() as tmp:
            make_federation(Path(tmp) / "certs")
            print(f"\n{header}\n|---|---|---|---|---|---|")
            for streams in args.streams.split(","):
                work = Path(tmp) / f"n{streams}"
                print(row(run_loopback(streams, args, work, Path(tmp) / "certs")), flush=True)
        return
    with Lab(spec=spec) as lab, tempfile.TemporaryDirectory() as tmp:
        for report in check_lab(lab):
            print(report.summary())
        lowats = args.notsent_lowat.split(",") if args.notsent_lowat else [""]
        rounds, runs = [], [(lowat, n) for lowat in lowats for n in args.streams.split(",")]
        for i, (lowat, streams) in enumerate(runs):
            if lowat and (i == 0 or runs[i - 1][0] != lowat):
                for ns in lab.hosts.values():
                    ns.set_sysctls({"net.ipv4.tcp_notsent_lowat": lowat})
                print(f"\nnet.ipv4.tcp_notsent_lowat = {lowat}")
            if i == 0 or runs[i - 1][0] != lowat:
                print(f"\n{header}\n|---|---|---|---|---|---|")
            label = f"{streams}, lowat {lowat}" if lowat else streams
            result = run(lab, streams, args, Path(tmp) / f"n{streams}-{lowat}", 7443 + i)
            print(row(result), flush=True)
            each = (f"{x['streams']} @ {float(x['goodputMbit']):.1f}" for x in result["links"])
            rounds.append(f"{label}: " + ", ".join(each))
        print("\nper round from round 1 (N @ goodput Mbit/s):\n" + "\n".join(rounds))


if __name__ == "__main__":
    main()

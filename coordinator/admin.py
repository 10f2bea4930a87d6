"""The admin side: calling ``Status`` over mTLS (an edge, like the agent's link) and
showing it to a person.

The tables take the status as plain data (``skyfed.coordinator.snapshot``), so the live
view of ``coordinator serve``, ``coordinator status`` and the demo show the same thing.
"""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path
from typing import Any

import grpc
from rich import box
from rich.console import Console
from rich.table import Table

from skyfed.coordinator.snapshot import run_wall_s, to_data
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import federation_pb2_grpc as pb_grpc
from skyfed.proto import serde
from skyfed.status import ReplicaSet, Status

Snapshot = dict[str, Any]


def fetch_status(
    address: str, certs: Path, name: str, timeout_s: float = 5.0, windows: bool = False
) -> Status:
    creds = grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.crt").read_bytes(),
        private_key=(certs / f"{name}.key").read_bytes(),
        certificate_chain=(certs / f"{name}.crt").read_bytes(),
    )
    with grpc.secure_channel(address, creds) as channel:
        reply = pb_grpc.FederationStub(channel).Status(
            pb.StatusRequest(windows=windows), timeout=timeout_s
        )
    return serde.status_from_proto(reply)


def fetch_leader_status(
    addresses: list[str], certs: Path, name: str, timeout_s: float = 5.0, windows: bool = False
) -> Status:
    """The status of the first of ``addresses`` that answers; when that is a standby
    replica's (docs/failover.md), the leader's it names instead, if it answers too."""
    failure: grpc.RpcError | None = None
    for address in addresses:
        try:
            status = fetch_status(address, certs, name, timeout_s, windows)
        except grpc.RpcError as exc:
            failure = exc
            continue
        replicas = status.replicas
        if replicas is None or replicas.leading or not replicas.leader_address:
            return status
        try:
            return fetch_status(replicas.leader_address, certs, name, timeout_s, windows)
        except grpc.RpcError:
            return status  # the standby's view: it names a leader that does not answer
    assert failure is not None
    raise failure


def fetch_snapshot(address: str, certs: Path, name: str, timeout_s: float = 5.0) -> Snapshot:
    return to_data(fetch_leader_status(address.split(","), certs, name, timeout_s))


def replicas_table(replicas: ReplicaSet) -> Table:
    """One row per coordinator replica: which leads, in which term, where each one's
    state stands (docs/failover.md)."""
    leader = replicas.leader or "none known"
    title = f"replicas  term {replicas.term}  leader {leader}  (answered by {replicas.replica})"
    if replicas.leading and replicas.alone:
        title += "  releasing alone: no standby follows"
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("replica", "address", "role", "round", "lag"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("round", "lag") else "left")
    names = {m.name for m in replicas.members}
    for m in replicas.members:
        role = "leader" if m.name == replicas.leader else m.state
        known = m.round >= 0 or m.lag >= 0
        table.add_row(
            m.name, m.address, role, str(m.round) if known else "-", str(m.lag) if known else "-"
        )
    if replicas.leader and replicas.leader not in names:
        table.add_row(replicas.leader, replicas.leader_address, "leader (no live lease seen)")
    table.caption = f"released round {replicas.released}; lag: rounds behind it"
    return table


def failovers_table(replicas: ReplicaSet) -> Table | None:
    """Every change of leader, with its cause and duration; None before the first."""
    if not replicas.failovers:
        return None
    table = Table(title="failovers", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("term", "from", "to", "cause", "took s", "round", "lost", "at (UTC)"):
        table.add_column(col, no_wrap=True)
    for f in replicas.failovers:
        at = datetime.datetime.fromtimestamp(f.at_unix_s, datetime.UTC)
        table.add_row(
            str(f.term),
            f.previous or "-",
            f.replica,
            f.cause,
            f"{f.duration_s:.1f}",
            str(f.round),
            str(f.lost_rounds),
            at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    table.caption = "took: the old leader's loss noticed -> the new leader serving"
    return table


def agents_table(snap: Snapshot) -> Table:
    """One row per agent; short headers so it fits an 80-column terminal."""
    table = Table(
        title=f"round {snap['round']}  weights {snap['weights_digest'][:12]}  exchange {snap['exchange']}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    headers = ("agent", "state", "codec", "sw", "N", "round", "rtt", "loss%")
    for col in (*headers, "Mb/s", "up MB", "dn MB"):
        left = col in ("agent", "state", "codec")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    for a in snap["agents"]:
        table.add_row(
            a["name"],
            a["state"],
            codec_cell(a["codec"], a.get("codec_params", "")),
            str(a["codec_switches"]),
            f"{a['streams']}/{a['stream_switches']}",
            str(a["last_round"]),
            f"{a['rtt_ms']:.1f}",
            f"{a['loss_pct']:.2f}",
            f"{a['goodput_mbit']:.1f}",
            f"{a['bytes_up'] / 1e6:.1f}",
            f"{a['bytes_down'] / 1e6:.1f}",
        )
    table.caption = (
        "rtt in ms; sw: codec switches; N: TCP connections/changes of N; Mb/s: goodput; "
        "bN: blocks of N; jitter, refusals, codec parameters, local steps, layouts: --json"
    )
    errors = [f"{a['name']}: {a['last_error']}" for a in snap["agents"] if a.get("last_error")]
    if errors:  # why a site went down (docs/sites.md): what an operator looks for first
        table.caption += "\nlast error  " + "\nlast error  ".join(errors)
    return table


def codec_cell(codec: str, params: str) -> str:
    """The codec and, where set, its blocks (``ecsgd b1024``: the long-phase rule's EC-SGD,
    docs/compression.md); the other parameters are in ``--json``."""
    block = json.loads(params).get("block") if params else None
    return f"{codec} b{block}" if block else codec


def efficiency_table(reply: Status) -> Table | None:
    """Each link's latest timed exchange against its floor, RTT + bytes / rate
    (docs/striping.md); None before any agent has timed one."""
    timed = [a for a in reply.agents if a.efficiency is not None]
    if not timed:
        return None
    table = Table(title="exchange against the floor", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("agent", "round", "exch s", "floor s", "ratio", "N", "limit"):
        table.add_column(col, justify="left" if col in ("agent", "limit") else "right")
    for a in timed:
        e = a.efficiency
        assert e is not None
        table.add_row(
            a.name,
            str(e.round),
            f"{e.exchange_s:.2f}",
            f"{e.floor_s:.2f}",
            f"{e.ratio:.1f}x",
            str(e.streams),
            e.limit or "-",
        )
    table.caption = "floor at each link's rate (link_rate_mbit, else its best goodput)"
    return table


def summary_table(snap: Snapshot, title: str = "skyfed run summary") -> Table:
    """The end-of-run figures: time split, bytes saved, training and held-out loss; its
    wall time is the run report's (:func:`~skyfed.coordinator.snapshot.run_wall_s`)."""
    rounds = list(snap["rounds"])
    wall_s = run_wall_s(rounds)
    n = max(1, len(rounds))
    round_s = sum(r["duration_s"] for r in rounds) / n
    train_s = sum(r["train_s"] for r in rounds) / n
    up, raw_up = sum(r["bytes_up"] for r in rounds), sum(r["raw_bytes_up"] for r in rounds)
    down, raw_down = sum(r["bytes_down"] for r in rounds), sum(r["raw_bytes_down"] for r in rounds)
    table = Table(title=title, show_header=False)
    table.add_row("rounds", f"{len(rounds)} in {wall_s:.1f} s wall")
    table.add_row(
        "per round",
        f"{round_s * 1000:.0f} ms = slowest agent's training {train_s * 1000:.0f} ms + exchange "
        f"{max(0.0, round_s - train_s) * 1000:.0f} ms",
    )
    table.add_row(
        "uplink",
        f"{up / 1e6:.2f} MB on the wire, {raw_up / 1e6:.2f} MB as fp32 "
        f"({raw_up / max(1, up):.1f}x smaller)",
    )
    table.add_row(
        "downlink",
        f"{down / 1e6:.2f} MB on the wire, {raw_down / 1e6:.2f} MB as fp32 "
        f"({raw_down / max(1, down):.1f}x smaller)",
    )
    if rounds:
        table.add_row(
            "training loss",
            f"{rounds[0]['mean_loss']:.3f} (round 0) -> {rounds[-1]['mean_loss']:.3f} "
            f"(round {rounds[-1]['round']})",
        )
    if snap.get("eval_round", -1) >= 0 and math.isfinite(snap["eval_loss"]):
        table.add_row(
            "held-out loss", f"{snap['eval_loss']:.3f} (weights of round {snap['eval_round']})"
        )
    table.add_row("coordinator", f"weights {snap['weights_digest'][:16]}")
    return table


PIPED_WIDTH = 1000
"""Columns of ``coordinator status`` into a pipe or a file: every row whole (a table is
as wide as its cells, not this), where a terminal's width would cut them."""


def render_status(reply: Status) -> None:
    from skyfed.coordinator.progress import headline  # the live view's first line

    snap = to_data(reply)
    console = Console()
    if not console.is_terminal:
        console.width = PIPED_WIDTH
    if reply.replicas is not None:
        console.print(replicas_table(reply.replicas))
        failovers = failovers_table(reply.replicas)
        if failovers is not None:
            console.print(failovers)
        if not reply.replicas.leading:  # a standby's answer: it holds no round
            return
    console.print(headline(snap), agents_table(snap))
    links = efficiency_table(reply)
    if links is not None:
        console.print(links)

"""The admin side: calling ``Status`` over mTLS (an edge, like the agent's link) and
showing it to a person."""

from __future__ import annotations

from pathlib import Path

import grpc
from rich import box
from rich.console import Console
from rich.table import Table

from skyfed.coordinator.status import Status
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import federation_pb2_grpc as pb_grpc
from skyfed.proto import serde


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


def agents_table(reply: Status) -> Table:
    """One row per agent; short headers so it fits an 80-column terminal."""
    table = Table(
        title=f"round {reply.round}  weights {reply.weights_digest[:12]}  exchange {reply.exchange}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    headers = ("agent", "state", "codec", "sw", "N", "round", "rtt", "loss%")
    for col in (*headers, "Mb/s", "up MB", "dn MB"):
        left = col in ("agent", "state", "codec")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    for a in reply.agents:
        table.add_row(
            a.name,
            a.state,
            a.codec,
            str(a.codec_switches),
            str(a.streams),
            str(a.last_round),
            f"{a.rtt_ms:.1f}",
            f"{a.loss_pct:.2f}",
            f"{a.goodput_mbit:.1f}",
            f"{a.bytes_up / 1e6:.1f}",
            f"{a.bytes_down / 1e6:.1f}",
        )
    table.caption = (
        "rtt in ms; sw: codec switches; N: TCP connections; Mb/s: goodput; jitter, refusals: --json"
    )
    return table


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


def render_status(reply: Status) -> None:
    console = Console()
    console.print(agents_table(reply))
    links = efficiency_table(reply)
    if links is not None:
        console.print(links)

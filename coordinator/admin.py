"""The admin side: calling ``Status`` over mTLS and showing it to a person."""

from __future__ import annotations

from pathlib import Path

import grpc
from rich.console import Console
from rich.table import Table

from skyfed.proto import federation_pb2 as pb
from skyfed.proto import federation_pb2_grpc as pb_grpc


def fetch_status(
    address: str, certs: Path, name: str, timeout_s: float = 5.0, windows: bool = False
) -> pb.StatusReply:
    creds = grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.crt").read_bytes(),
        private_key=(certs / f"{name}.key").read_bytes(),
        certificate_chain=(certs / f"{name}.crt").read_bytes(),
    )
    with grpc.secure_channel(address, creds) as channel:
        return pb_grpc.FederationStub(channel).Status(
            pb.StatusRequest(windows=windows), timeout=timeout_s
        )


def agents_table(reply: pb.StatusReply) -> Table:
    table = Table(title=f"round {reply.round}  weights {reply.weights_digest[:12]}")
    cols = ("agent", "state", "codec", "switches", "last round", "rtt ms", "jitter ms", "loss %")
    for col in (*cols, "goodput Mbit/s", "up MB", "down MB", "refused"):
        left = col in ("agent", "state", "codec")
        table.add_column(col, justify="left" if left else "right", no_wrap=left)
    for a in reply.agents:
        table.add_row(
            f"{a.cloud}/{a.name}",
            a.state,
            a.codec,
            str(a.codec_switches),
            str(a.last_round),
            f"{a.rtt_ms:.1f}",
            f"{a.jitter_ms:.1f}",
            f"{a.loss_pct:.2f}",
            f"{a.goodput_mbit:.1f}",
            f"{a.bytes_up / 1e6:.2f}",
            f"{a.bytes_down / 1e6:.2f}",
            str(a.refused),
        )
    return table


def render_status(reply: pb.StatusReply) -> None:
    Console().print(agents_table(reply))

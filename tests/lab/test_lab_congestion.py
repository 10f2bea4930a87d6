"""A profile's congestion control reaches both ends' sockets, and services can read it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from skyfed.lab.topology import COORDINATOR, Lab

pytestmark = pytest.mark.lab

CC_OF = "lambda s: s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).strip(b'\\0')"
SERVER = f"""
import socket, sys
cc = {CC_OF}
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
peer, _ = server.accept()
peer.sendall(cc(peer))
"""
CLIENT = f"""
import socket, sys
cc = {CC_OF}
client = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
print(cc(client).decode(), client.recv(16).decode())
"""
NETINFO = "from skyfed.netinfo import congestion_control as c; import sys; print(c(sys.argv[1]))"


def _argv(lab: Lab, host: str, code: str, *args: str) -> list[str]:
    return lab.hosts[host].exec_argv([sys.executable, "-c", code, *args])


@pytest.mark.parametrize("cc", ["bbr", "cubic"])
def test_a_profiles_congestion_control_reaches_sockets_at_both_ends(
    make_lab: Callable[..., Lab], cc: str
) -> None:
    lab = make_lab(f"aws-1=lan+{cc}")
    agent, coordinator = str(lab.address("aws-1")), str(lab.address(COORDINATOR))
    for host, peer in (("aws-1", coordinator), (COORDINATOR, agent)):
        seen = subprocess.run(
            _argv(lab, host, NETINFO, peer), capture_output=True, text=True, check=True
        ).stdout.strip()
        assert seen == f"CongestionControl(name='{cc}', source='route')", (host, seen)
    server = subprocess.Popen(
        _argv(lab, COORDINATOR, SERVER, coordinator), stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        out = subprocess.run(
            _argv(lab, "aws-1", CLIENT, coordinator, port),
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.split()
    finally:
        server.kill()
        server.wait()
    assert out == [cc, cc], out  # the agent's active socket, the coordinator's accepted one

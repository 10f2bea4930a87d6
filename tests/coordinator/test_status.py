"""The admin status call: who is connected, and each link's raw windows for plots."""

from __future__ import annotations

import math
import time

from skyfed.coordinator.admin import fetch_status
from skyfed.proto import federation_pb2 as pb

from .test_bad_input import contribution, deltas, join, send


def test_status_lists_agents_and_raw_link_windows_on_request(serve, raw_agent, pki):
    running = serve(monitor={"window_s": 0.1}, probe_port=-1)
    agent = raw_agent(running.port, "aws-1")
    join(agent, "aws", "aws-1")
    agent.echo_delay_s = 0.05  # the coordinator sees a 50 ms link: a 42 ms claim stands
    for _ in range(8):
        agent.send(heartbeat=pb.Heartbeat(sent_ns=time.monotonic_ns(), rtt_ms=42.0))
        time.sleep(0.05)
    time.sleep(0.2)
    address = f"localhost:{running.port}"
    plain = fetch_status(address, pki.directory, "coordinator")
    detailed = fetch_status(address, pki.directory, "coordinator", windows=True)
    assert [(a.cloud, a.name) for a in plain.agents] == [("aws", "aws-1")]
    assert not plain.agents[0].windows
    rtts = [w.rtt_ms for w in detailed.agents[0].windows if not math.isnan(w.rtt_ms)]
    assert rtts and all(r == 42.0 for r in rtts)


def test_welcome_and_status_name_the_federations_exchange(serve, raw_agent, pki):
    running = serve(exchange="gradient", sgd_lr=0.05, probe_port=-1)
    welcome = join(raw_agent(running.port, "aws-1"), "aws", "aws-1", exchanges=("gradient",))
    assert (welcome.exchange, welcome.sgd_lr, welcome.sgd_momentum) == ("gradient", 0.05, 0.9)
    status = fetch_status(f"localhost:{running.port}", pki.directory, "coordinator")
    assert status.exchange == "gradient"


def test_the_agents_table_shows_each_links_n_and_its_changes_of_n(serve, raw_agent, pki):
    from rich.console import Console

    from skyfed.coordinator.admin import agents_table, fetch_snapshot

    running = serve(probe_port=-1)
    join(raw_agent(running.port, "aws-1"), "aws", "aws-1")
    snap = fetch_snapshot(f"localhost:{running.port}", pki.directory, "coordinator")
    snap["agents"][0] |= {"streams": 16, "stream_switches": 2}  # as after 1 -> 4 -> 16
    console = Console(width=100, record=True)
    console.print(agents_table(snap))
    text = console.export_text()
    assert "16/2" in text and "N: TCP connections/changes of N" in text


def test_a_member_that_left_after_the_round_closed_is_still_in_the_observers_status(
    serve, raw_agent
):
    """An agent that has applied the final round closes its stream at once, often before
    the observer's thread runs: the run history's line for that round must still name its
    link (as ``disconnected``, with its figures as it left), and plain status must not."""
    running = serve(min_agents=2, probe_port=-1)
    stays, leaves = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(stays, "aws", "aws-1"), join(leaves, "gcp", "gcp-1")
    send(stays, *contribution(deltas(1)))
    send(leaves, *contribution(deltas(2)))
    assert leaves.expect("receipt").receipt.accepted
    assert leaves.expect("round_end").round_end.round == 0
    leaves.close()
    fed = running.federation
    deadline = time.monotonic() + 10
    while "gcp-1" in {a.name for a in fed.status().agents}:
        assert time.monotonic() < deadline, "the closed stream never left"
        time.sleep(0.05)
    observed = {a.name: a for a in fed.status(departed=True).agents}
    assert set(observed) == {"aws-1", "gcp-1"}
    assert observed["gcp-1"].state == "disconnected"
    assert observed["gcp-1"].bytes_up > 0 and observed["gcp-1"].last_round == 0


def test_a_site_that_leaves_saying_why_is_down_in_status_with_its_reason(serve, raw_agent, pki):
    from skyfed.coordinator.snapshot import to_data, waiting_for

    running = serve(min_agents=2, probe_port=-1)
    join(raw_agent(running.port, "aws-1"), "aws", "aws-1")
    gcp = raw_agent(running.port, "gcp-1")
    join(gcp, "gcp", "gcp-1")
    reason = "rank 3 (dp 1, tp 1) on node-b killed by SIGKILL"
    gcp.send(leave=pb.Leave(reason=reason))
    fed = running.federation
    deadline = time.monotonic() + 10
    while "down" not in {a.state for a in fed.status().agents}:
        assert time.monotonic() < deadline, "the site never showed as down"
        time.sleep(0.05)
    status = fetch_status(f"localhost:{running.port}", pki.directory, "coordinator")
    (down,) = [a for a in status.agents if a.name == "gcp-1"]
    assert (down.state, down.last_error) == ("down", reason)
    assert waiting_for(to_data(fed.status())) == (
        f"waiting for 2 agents, 1 connected: aws-1; gcp-1 down: {reason}"
    )


def test_a_sites_hello_tells_its_last_error_and_a_rejoin_clears_down(serve, raw_agent):
    running = serve(probe_port=-1)
    gcp = raw_agent(running.port, "gcp-1")
    join(gcp, "gcp", "gcp-1")
    gcp.send(leave=pb.Leave(reason="rank 1 on node-a: RuntimeError: CUDA error: out of memory"))
    gcp.ended()
    again = raw_agent(running.port, "gcp-1")
    join(again, "gcp", "gcp-1", last_error="rank 2 on node-a killed by SIGTERM")
    (agent,) = running.federation.status().agents
    assert (agent.state, agent.last_error) == ("idle", "rank 2 on node-a killed by SIGTERM")


def test_a_reason_that_is_not_one_printable_line_is_refused(serve, raw_agent):
    running = serve(probe_port=-1)
    gcp = raw_agent(running.port, "gcp-1")
    join(gcp, "gcp", "gcp-1")
    gcp.send(leave=pb.Leave(reason="two\nlines"))
    code, details = gcp.ended()
    assert code.name == "INVALID_ARGUMENT" and "leave.reason" in details


def test_the_agents_table_says_why_a_site_went_down(serve, raw_agent, pki):
    from rich.console import Console

    from skyfed.coordinator.admin import agents_table, fetch_snapshot

    running = serve(probe_port=-1)
    gcp = raw_agent(running.port, "gcp-1")
    join(gcp, "gcp", "gcp-1")
    gcp.send(leave=pb.Leave(reason="rank 1 (dp 1, tp 0) on node-a killed by SIGKILL"))
    gcp.ended()
    snap = fetch_snapshot(f"localhost:{running.port}", pki.directory, "coordinator")
    console = Console(width=120, record=True)
    console.print(agents_table(snap))
    assert "gcp-1: rank 1 (dp 1, tp 0) on node-a killed by SIGKILL" in console.export_text()

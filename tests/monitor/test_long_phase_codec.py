"""The long-phase rule through real gRPC over TLS: an agent's hello says its local steps,
and a far link of long local phases gets EC-SGD 2-bit in the long-phase rule's blocks
(1024, said explicitly), on the policy's medium row (Top-k for short phases) as on its
heavy row."""

from __future__ import annotations

import json
import logging

from rich.console import Console

from skyfed.coordinator.admin import agents_table
from skyfed.coordinator.snapshot import to_data

from ..coordinator.test_bad_input import contribution, deltas, send
from .test_monitor_coordinator import ADAPTIVE, beat, join


def test_far_link_of_128_local_steps_gets_ecsgd_2_bit_in_the_long_phase_blocks(
    serve, raw_agent, caplog
):
    caplog.set_level(logging.INFO, logger="skyfed.coordinator.links")
    running = serve(min_agents=2, **ADAPTIVE)
    long, old = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(long, "aws", "aws-1", local_steps=128)
    join(old, "gcp", "gcp-1", local_steps=0)
    beat({long: 300.0, old: 300.0}, seconds=0.6)  # both far: the policy's heavy row
    send(long, *contribution(deltas(1)))
    send(old, *contribution(deltas(2)))
    skip = ("heartbeat", "chunk", "receipt")
    end = long.expect("round_end", skip=skip).round_end
    assert (end.codec, json.loads(end.codec_params)) == ("ecsgd", {"bits": 2, "block": 1024})
    end = old.expect("round_end", skip=skip).round_end
    assert (end.codec, json.loads(end.codec_params)) == ("ecsgd", {"bits": 2})  # the codec's
    agents = {a.name: a for a in running.federation.status().agents}
    assert agents["aws-1"].local_steps == 128 and agents["gcp-1"].local_steps == 0
    assert json.loads(agents["aws-1"].codec_params) == {"bits": 2, "block": 1024}
    rows = {r.split()[0]: r for r in _rendered(agents_table(to_data(running.federation.status())))}
    assert "ecsgd b1024" in rows["aws-1"] and "ecsgd b" not in rows["gcp-1"]
    lines = [r.getMessage() for r in caplog.records if "[Coordinator.Codec]" in r.getMessage()]
    (switch,) = [line for line in lines if "aws-1" in line]
    assert "to=ecsgd" in switch and 'params={"bits":2,"block":1024} local_steps=128' in switch


def test_medium_link_of_128_local_steps_gets_ecsgd_where_short_phases_get_topk(
    serve, raw_agent, caplog
):
    caplog.set_level(logging.INFO, logger="skyfed.coordinator.links")
    running = serve(min_agents=2, **ADAPTIVE)
    long, short = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(long, "aws", "aws-1", local_steps=128)
    join(short, "gcp", "gcp-1", local_steps=4)
    beat({long: 100.0, short: 100.0}, seconds=0.6)  # both 100 ms: the policy's medium row
    send(long, *contribution(deltas(1)))
    send(short, *contribution(deltas(2)))
    skip = ("heartbeat", "chunk", "receipt")
    end = long.expect("round_end", skip=skip).round_end
    assert (end.codec, json.loads(end.codec_params)) == ("ecsgd", {"bits": 2, "block": 1024})
    assert short.expect("round_end", skip=skip).round_end.codec == "topk"
    lines = [r.getMessage() for r in caplog.records if "[Coordinator.Codec]" in r.getMessage()]
    (switch,) = [line for line in lines if "aws-1" in line]
    assert "to=ecsgd" in switch and "local_steps=128" in switch


def _rendered(table) -> list[str]:
    """The table's lines as ``coordinator status`` prints them."""
    console = Console(width=200, record=True)
    console.print(table)
    return [line.strip() for line in console.export_text().splitlines() if line.strip()]

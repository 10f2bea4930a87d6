"""The coordinator's side: what probes and heartbeats measure picks each link's codec at
round ends."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import pytest

from skyfed.compression import codec_names, frame
from skyfed.coordinator.links import CodecRun
from skyfed.fingerprint import weights_digest
from skyfed.proto import federation_pb2 as pb
from skyfed.proto.probe_packet import PROBE, Packet, pack
from skyfed.proto.serde import specs_to_proto

from ..coordinator.test_bad_input import contribution, deltas, model_and_spec, send

ADAPTIVE = {
    "codec": "auto",
    "monitor": {"window_s": 0.1},
    "policy": {"heavier_after_windows": 2, "lighter_after_windows": 2},
}


def join(agent, cloud: str, name: str, local_steps: int = 0) -> pb.Welcome:
    """A hello as the agent sends it, with ``local_steps`` (0: as an agent from before
    the field, which leaves it unset)."""
    weights, spec = model_and_spec()
    hello = pb.Hello(
        frame_version=frame.VERSION,
        cloud=cloud,
        name=name,
        task="chargpt",
        tensors=specs_to_proto(spec),
        codecs=codec_names(),
        last_round=-1,
        weights_digest=weights_digest(weights),
        local_steps=local_steps,
    )
    agent.send(hello=hello)
    welcome = agent.expect("welcome").welcome
    agent.probes = Probes(welcome)
    return welcome


class Probes:
    """Signed probes to the coordinator's echo, each reporting a round trip, as an agent's
    probe sends them (the echoes are not read)."""

    opened: list[socket.socket] = []  # closed after each test

    def __init__(self, welcome: pb.Welcome) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        Probes.opened.append(self.sock)
        self.address = ("127.0.0.1", welcome.probe_port)
        self.probe_id, self.key, self.seq = welcome.probe_id, welcome.probe_key, 0

    def report(self, rtt_ms: float) -> None:
        packet = Packet(PROBE, self.probe_id, self.seq, time.monotonic_ns(), rtt_ms)
        self.sock.sendto(pack(packet, self.key), self.address)
        self.seq += 1


@pytest.fixture(autouse=True)
def _close_probes() -> Iterator[None]:
    yield
    while Probes.opened:
        Probes.opened.pop().close()


def beat(agents_rtts: dict, seconds: float, lost_per_beat: int = 0) -> None:
    """Every 20 ms from each agent, a probe reporting this round trip and a heartbeat with
    the probe's running counts (5 probes settled, ``lost_per_beat`` of them lost)."""
    settled, lost = 0, 0
    for agent, rtt_ms in agents_rtts.items():
        agent.echo_delay_s = rtt_ms / 1000  # what the coordinator sees of the link itself
    for _ in range(int(seconds / 0.02)):
        settled += 5
        lost += lost_per_beat
        for agent, rtt_ms in agents_rtts.items():
            agent.probes.report(rtt_ms)
            agent.probes.seq += lost_per_beat  # the echo sees those probes' gaps
            hb = pb.Heartbeat(sent_ns=time.monotonic_ns(), probes_settled=settled, probes_lost=lost)
            agent.send(heartbeat=hb)
        time.sleep(0.02)


def test_each_link_gets_its_own_codec_and_every_switch_is_logged_and_counted(
    serve, raw_agent, caplog
):
    caplog.set_level(logging.INFO, logger="skyfed.coordinator.links")
    running = serve(min_agents=2, **ADAPTIVE)
    far, near = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    welcome = join(far, "aws", "aws-1")
    join(near, "gcp", "gcp-1")
    assert welcome.codec == "fp16" and welcome.probe_port > 0 and len(welcome.probe_key) == 32
    beat({far: 300.0, near: 5.0}, seconds=0.6)
    send(far, *contribution(deltas(1)))
    send(near, *contribution(deltas(2)))
    assert (
        far.expect("round_end", skip=("heartbeat", "chunk", "receipt")).round_end.codec == "ecsgd"
    )
    assert (
        near.expect("round_end", skip=("heartbeat", "chunk", "receipt")).round_end.codec == "fp16"
    )
    agents = {a.name: a for a in running.federation.status().agents}
    assert (agents["aws-1"].codec, agents["aws-1"].codec_switches) == ("ecsgd", 1)
    assert (agents["gcp-1"].codec, agents["gcp-1"].codec_switches) == ("fp16", 0)
    assert abs(agents["aws-1"].rtt_ms - 300.0) < 1 and agents["aws-1"].loss_pct == 0.0
    (line,) = [r.getMessage() for r in caplog.records if "[Coordinator.Codec]" in r.getMessage()]
    assert "agent=spiffe://" in line and "from=fp16 to=ecsgd rtt_ms=300.0" in line
    assert "loss_pct=0.00" in line and "goodput_mbit=" in line


def test_round_trips_on_the_probe_reach_the_policy_with_no_stream_round_trip(serve, raw_agent):
    """The path a stalled stream cannot delay: heartbeats claim nothing, signed probes
    report the round trips (which the coordinator's own echoes of the link bear out)."""
    running = serve(min_agents=1, **ADAPTIVE)
    agent = raw_agent(running.port, "aws-1")
    join(agent, "aws", "aws-1")
    agent.echo_delay_s = 0.3
    for _ in range(30):
        agent.probes.report(300.0)
        agent.send(heartbeat=pb.Heartbeat(sent_ns=time.monotonic_ns()))
        time.sleep(0.02)
    send(agent, *contribution(deltas(1)))
    assert (
        agent.expect("round_end", skip=("heartbeat", "chunk", "receipt")).round_end.codec == "ecsgd"
    )


def _stream_beats(agent, rtt_ms: float, seconds: float, probe_rtt_ms: float = 0.0) -> None:
    """Heartbeats whose own round trip is ``rtt_ms`` (a stream behind a transfer reads
    long), with a probe that settles probes and reports ``probe_rtt_ms`` (0: never)."""
    agent.echo_delay_s = rtt_ms / 1000
    for i in range(int(seconds / 0.02)):
        if probe_rtt_ms:
            agent.probes.report(probe_rtt_ms)
        hb = pb.Heartbeat(sent_ns=time.monotonic_ns(), rtt_ms=rtt_ms, probes_settled=5 * (i + 1))
        agent.send(heartbeat=hb)
        time.sleep(0.02)


def test_the_heartbeats_round_trip_stands_in_only_while_the_probe_reports_none(serve, raw_agent):
    running = serve(min_agents=2, **ADAPTIVE)
    old, probed = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(old, "aws", "aws-1")  # an agent whose probes carry no round trip
    join(probed, "gcp", "gcp-1")
    for _ in range(2):  # interleaved, so both links see the same 0.6 s
        _stream_beats(old, rtt_ms=300.0, seconds=0.3)
        _stream_beats(probed, rtt_ms=300.0, seconds=0.3, probe_rtt_ms=5.0)
    send(old, *contribution(deltas(1)))
    send(probed, *contribution(deltas(2)))
    skip = ("heartbeat", "chunk", "receipt")
    assert old.expect("round_end", skip=skip).round_end.codec == "ecsgd"
    assert probed.expect("round_end", skip=skip).round_end.codec == "fp16"


def test_a_lossy_near_link_gets_heavier_compression(serve, raw_agent):
    running = serve(min_agents=1, **ADAPTIVE)
    agent = raw_agent(running.port, "aws-1")
    join(agent, "aws", "aws-1")
    beat({agent: 10.0}, seconds=0.6, lost_per_beat=1)  # 20 % of round trips: 10.6 % one way
    send(agent, *contribution(deltas(1)))
    assert (
        agent.expect("round_end", skip=("heartbeat", "chunk", "receipt")).round_end.codec == "ecsgd"
    )
    (status,) = running.federation.status().agents
    assert 9.0 < status.loss_pct < 12.0


def test_a_fixed_codec_is_kept_whatever_the_link(serve, raw_agent):
    running = serve(min_agents=1, codec="topk", monitor={"window_s": 0.1})
    agent = raw_agent(running.port, "aws-1")
    assert join(agent, "aws", "aws-1").codec == "topk"
    beat({agent: 5.0}, seconds=0.3)
    send(agent, *contribution(deltas(1)))
    assert (
        agent.expect("round_end", skip=("heartbeat", "chunk", "receipt")).round_end.codec == "topk"
    )


def test_topk_density_warms_up_over_the_first_rounds(serve, raw_agent):
    policy = {"topk_density": 0.01, "topk_warmup_rounds": 2, "topk_warmup_start": 0.25}
    running = serve(min_agents=1, codec="topk", policy=policy)
    agent = raw_agent(running.port, "aws-1")
    densities = [json.loads(join(agent, "aws", "aws-1").codec_params)["density"]]
    for round_ in range(2):
        send(agent, *contribution(deltas(round_), round=round_))
        end = agent.expect("round_end", skip=("heartbeat", "chunk", "receipt")).round_end
        densities.append(json.loads(end.codec_params)["density"])
    assert densities == pytest.approx([0.25, 0.05, 0.01])  # 0.25 * (0.01 / 0.25) ** (t / 2)


def _round(agent, round_: int) -> tuple[pb.RoundEnd, str, int]:
    """Contribute to ``round_``; the round's end, the aggregate's codec and its bytes."""
    send(agent, *contribution(deltas(round_), round=round_))
    codecs, size = set(), 0
    while True:
        message = agent.inbox.get(timeout=10)
        kind = message.WhichOneof("body")
        if kind == "round_end":
            (codec,) = codecs
            return message.round_end, codec, size
        if kind == "chunk":
            codecs.add(message.chunk.codec)
            size += len(message.chunk.data)


def test_topk_warmup_starts_again_when_a_link_switches_to_topk(serve, raw_agent):
    """The residual is empty when a link comes to Top-k from FP16, as at round 0, so the
    density warm-up counts from the switch, on the uplink and on the downlink."""
    warmup = {"topk_density": 0.01, "topk_warmup_rounds": 2, "topk_warmup_start": 0.25}
    policy = {**ADAPTIVE["policy"], **warmup}
    running = serve(min_agents=1, **{**ADAPTIVE, "policy": policy})
    agent = raw_agent(running.port, "aws-1")
    assert join(agent, "aws", "aws-1").codec == "fp16"
    beat({agent: 5.0}, seconds=0.3)
    assert _round(agent, 0)[0].codec == "fp16"
    beat({agent: 100.0}, seconds=0.6)  # 50-200 ms: Top-k from round 2 on
    ends = [_round(agent, r) for r in range(1, 5)]
    assert [end.codec for end, _, _ in ends] == ["topk"] * 4
    uplink = [json.loads(end.codec_params)["density"] for end, _, _ in ends]
    assert uplink == pytest.approx([0.25, 0.05, 0.01, 0.01])  # rounds 2, 3, 4, 5
    assert [codec for _, codec, _ in ends] == ["fp16", "topk", "topk", "topk"]
    topk_bytes = [size for _, _, size in ends[1:]]  # the downlink's rounds 2, 3, 4
    assert topk_bytes[0] > 2 * topk_bytes[1] > 4 * topk_bytes[2]
    assert running.federation.model.downlink.run == CodecRun("topk", 2)


def test_topk_warmup_goes_on_where_it_was_when_an_agent_reconnects(serve, raw_agent):
    """An agent keeps its residual across sessions, so a reconnect does not restart the
    warm-up; nor does a first join after round 0 (the warm-up counts from round 0 then)."""
    warmup = {"topk_density": 0.01, "topk_warmup_rounds": 2, "topk_warmup_start": 0.25}
    running = serve(min_agents=1, codec="topk", policy=warmup)
    first = raw_agent(running.port, "aws-1")
    assert json.loads(join(first, "aws", "aws-1").codec_params)["density"] == 0.25
    for round_ in range(3):
        _round(first, round_)
    again = raw_agent(running.port, "aws-1")  # replaces the first session
    assert json.loads(join(again, "aws", "aws-1").codec_params)["density"] == 0.01
    late = raw_agent(running.port, "gcp-1")
    assert json.loads(join(late, "gcp", "gcp-1").codec_params)["density"] == 0.01


def test_claimed_link_figures_the_coordinator_does_not_see_move_no_codec(serve, raw_agent):
    """One agent claiming 400 ms and 50 % loss on loopback (its probes all arrive, its
    echoes come at once): neither its link nor the shared downlink gets heavier."""
    running = serve(min_agents=2, **ADAPTIVE)
    liar, honest = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(liar, "aws", "aws-1"), join(honest, "gcp", "gcp-1")
    liar.echo_delay_s = honest.echo_delay_s = 0.0
    for i in range(40):
        liar.probes.report(400.0)
        honest.probes.report(1.0)
        claim = pb.Heartbeat(
            sent_ns=time.monotonic_ns(),
            rtt_ms=400.0,
            probes_settled=10 * (i + 1),
            probes_lost=5 * (i + 1),
        )
        liar.send(heartbeat=claim)
        honest.send(heartbeat=pb.Heartbeat(sent_ns=time.monotonic_ns(), probes_settled=5 * i))
        time.sleep(0.02)
    send(liar, *contribution(deltas(1)))
    send(honest, *contribution(deltas(2)))
    skip = ("heartbeat", "chunk", "receipt")
    assert liar.expect("round_end", skip=skip).round_end.codec == "fp16"
    assert honest.expect("round_end", skip=skip).round_end.codec == "fp16"
    assert running.federation.rounds.history[-1].downlink_codec == "fp16"

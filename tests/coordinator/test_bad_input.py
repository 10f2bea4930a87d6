"""Bad contributions are refused with a clear status and never reach the aggregate."""

from __future__ import annotations

import math
import zlib

import grpc
import pytest
import torch

from skyfed.compression import frame, make_codec
from skyfed.fingerprint import model_spec, sha256_weights_digest, weights_digest
from skyfed.proto import federation_pb2 as pb
from skyfed.proto.chunks import cut_all
from skyfed.proto.serde import chunk_to_proto, specs_to_proto
from skyfed.tasks import load_task
from skyfed.wire import ChunkKind, Payload

MAX_CHUNK = 4096
BAD_TENSOR = 5  # bad data comes after good tensors were already summed
SAMPLES = 16


def model_and_spec():
    model = load_task("chargpt").build_model(0)
    named = list(model.named_parameters())
    return [p.detach().clone() for _, p in named], model_spec(named)


def hello(
    cloud: str,
    name: str,
    codecs: tuple[str, ...] = ("fp32",),
    exchanges: tuple[str, ...] = (),
    **fields: object,
) -> pb.Hello:
    """A fresh agent's hello for the default task; ``fields`` set any other field."""
    weights, spec = model_and_spec()
    return pb.Hello(
        frame_version=frame.VERSION,
        cloud=cloud,
        name=name,
        task="chargpt",
        tensors=specs_to_proto(spec),
        codecs=list(codecs),
        last_round=-1,
        weights_digest=weights_digest(weights),
        exchanges=list(exchanges),
        **fields,
    )


def join(
    agent,
    cloud: str,
    name: str,
    codecs: tuple[str, ...] = ("fp32",),
    exchanges: tuple[str, ...] = (),
    last_error: str = "",
) -> pb.Welcome:
    agent.send(hello=hello(cloud, name, codecs, exchanges, last_error=last_error))
    return agent.expect("welcome").welcome


def deltas(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    weights, _ = model_and_spec()
    return [torch.randn(w.shape, generator=gen) * 1e-3 for w in weights]


def contribution(
    values: list[torch.Tensor], round: int = 0
) -> tuple[pb.Contribution, list[pb.Chunk]]:
    fp32 = make_codec("fp32")
    payloads = [Payload(i, None, "fp32", fp32.encode(v)) for i, v in enumerate(values)]
    cut = cut_all(payloads, kind=ChunkKind.GRADIENT, round=round, max_chunk_bytes=MAX_CHUNK)
    chunks = [chunk_to_proto(c) for c in cut]
    return pb.Contribution(round=round, chunks=len(chunks), samples=SAMPLES), chunks


def first_chunk_of(chunks: list[pb.Chunk], tensor: int) -> int:
    return next(i for i, c in enumerate(chunks) if c.tensor == tensor)


def send(agent, header: pb.Contribution | None, chunks: list[pb.Chunk]) -> None:
    if header is not None:
        agent.send(contribution=header)
    for c in chunks:
        agent.send(chunk=c)


def _bad_values(value: float):
    def make():
        values = deltas(99)
        values[BAD_TENSOR].view(-1)[3] = value
        return contribution(values)

    return make


def _mutate_chunk(mutation):
    def make():
        header, chunks = contribution(deltas(99))
        i = first_chunk_of(chunks, BAD_TENSOR)
        chunks = mutation(chunks, i)
        header.chunks = len(chunks)
        return header, chunks

    return make


def _set(i_field: str, value):
    def mutate(chunks, i):
        setattr(chunks[i], i_field, value)
        return chunks

    return mutate


def _oversize(chunks, i):
    data = b"\0" * (MAX_CHUNK + 1)
    chunks[i].data, chunks[i].crc32 = data, zlib.crc32(data)
    return chunks


def _duplicate(chunks, i):
    return chunks[: i + 1] + [chunks[i]] + chunks[i + 1 :]


def _swap(chunks, i):
    chunks[i], chunks[i + 1] = chunks[i + 1], chunks[i]
    return chunks


def _garble(chunks, i):
    data = b"not a payload" + bytes(chunks[i].data[13:])
    chunks[i].data, chunks[i].crc32 = data, zlib.crc32(data)
    return chunks


def _wrong_shape():
    values = deltas(99)
    values[BAD_TENSOR] = values[BAD_TENSOR].reshape(-1)[:-1]
    return contribution(values)


CASES = {
    "nan": (_bad_values(math.nan), grpc.StatusCode.INVALID_ARGUMENT, "NaN or Inf"),
    "inf": (_bad_values(math.inf), grpc.StatusCode.INVALID_ARGUMENT, "NaN or Inf"),
    "wrong-shape": (_wrong_shape, grpc.StatusCode.INVALID_ARGUMENT, "expected"),
    "bad-checksum": (_mutate_chunk(_set("crc32", 12345)), grpc.StatusCode.DATA_LOSS, "crc32"),
    "oversized": (_mutate_chunk(_oversize), grpc.StatusCode.RESOURCE_EXHAUSTED, "bound"),
    "duplicate-seq": (_mutate_chunk(_duplicate), grpc.StatusCode.INVALID_ARGUMENT, "repeats"),
    "out-of-order": (_mutate_chunk(_swap), grpc.StatusCode.INVALID_ARGUMENT, "skips ahead"),
    "unknown-codec": (
        _mutate_chunk(_set("codec", "zip")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "codec",
    ),
    "garbled-payload": (
        _mutate_chunk(_garble),
        grpc.StatusCode.INVALID_ARGUMENT,
        "not a skyfed frame",
    ),
}


def expected_weights(*seeds: int) -> list[torch.Tensor]:
    weights, _ = model_and_spec()
    sums = [torch.zeros(w.shape, dtype=torch.float64) for w in weights]
    for seed in seeds:
        for s, d in zip(sums, deltas(seed), strict=True):
            s.add_(d.double(), alpha=SAMPLES)
    return [w - (s / (SAMPLES * len(seeds))).float() for w, s in zip(weights, sums, strict=True)]


@pytest.mark.parametrize("case", list(CASES))
def test_bad_contribution_is_refused_and_never_reaches_the_aggregate(serve, raw_agent, case):
    make, code, words = CASES[case]
    running = serve(min_agents=3, max_chunk_bytes=MAX_CHUNK)
    aws, gcp, bad = (raw_agent(running.port, n) for n in ("aws-1", "gcp-1", "azure-1"))
    join(aws, "aws", "aws-1"), join(gcp, "gcp", "gcp-1"), join(bad, "azure", "azure-1")

    send(bad, *make())
    got, details = bad.ended()
    assert got == code, details
    assert words in details

    for agent, seed in ((aws, 1), (gcp, 2)):
        send(agent, *contribution(deltas(seed)))
        assert agent.expect("receipt").receipt.accepted
    assert aws.expect("round_end").round_end.contributors == 2
    for got_w, want in zip(running.federation.model.weights, expected_weights(1, 2), strict=True):
        torch.testing.assert_close(got_w, want, rtol=0, atol=1e-7)


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (pb.AgentMessage(), "empty or unknown"),
        (pb.AgentMessage(chunk=pb.Chunk(round=0)), "outside an announced contribution"),
        (
            pb.AgentMessage(contribution=pb.Contribution(round=7, chunks=1, samples=1)),
            "round 0 is open",
        ),
        (
            pb.AgentMessage(contribution=pb.Contribution(round=0, chunks=1, samples=0)),
            "contribution.samples",
        ),
    ],
    ids=["empty", "chunk-without-header", "future-round", "zero-samples"],
)
def test_malformed_message_is_invalid_argument(serve, raw_agent, message, words):
    running = serve(min_agents=2)
    bad = raw_agent(running.port, "azure-1")
    join(bad, "azure", "azure-1")
    bad._out.put(message)
    code, details = bad.ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert words in details


def test_message_before_hello_is_refused(serve, raw_agent):
    running = serve()
    agent = raw_agent(running.port, "aws-1")
    send(agent, *contribution(deltas(1)))
    code, details = agent.ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "hello" in details


def test_agent_without_the_federations_exchange_is_failed_precondition(serve, raw_agent):
    running = serve(exchange="gradient")
    agent = raw_agent(running.port, "aws-1")
    _, spec = model_and_spec()
    hello = pb.Hello(
        frame_version=frame.VERSION,
        cloud="aws",
        name="aws-1",
        tensors=specs_to_proto(spec),
        last_round=-1,
    )
    agent.send(hello=hello)  # an agent from before gradient exchange offers none: delta
    code, details = agent.ended()
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "exchanges 'gradient'" in details and "['delta']" in details


def test_agent_of_long_phases_under_dilocos_nesterov_defaults_is_failed_precondition(
    serve, raw_agent
):
    """DiLoCo's 0.7 / 0.9 diverged at 128 local steps: such an agent is refused with the
    reason, an agent of short phases joins, and a rate and momentum set are the
    operator's to try."""
    running = serve(min_agents=2, outer_optimizer="nesterov")
    long, short = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    _, spec = model_and_spec()
    hello = pb.Hello(
        frame_version=frame.VERSION,
        cloud="aws",
        name="aws-1",
        tensors=specs_to_proto(spec),
        last_round=-1,
        local_steps=128,
    )
    long.send(hello=hello)
    code, details = long.ended()
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "128 local steps" in details and "outer_lr and outer_momentum" in details
    join(short, "gcp", "gcp-1")  # 0 local steps said: an agent from before the field
    set_explicitly = serve(
        min_agents=2, outer_optimizer="nesterov", outer_lr=0.3, outer_momentum=0.5
    )
    tried = raw_agent(set_explicitly.port, "aws-1")
    tried.send(hello=hello)
    assert tried.expect("welcome").welcome.round == 0


def _precondition_refusal(running, raw_agent, digest_of) -> str:
    """The details of a hello refused at admission, naming the weights by ``digest_of``
    and, like an agent from before the field, no frame version unless told."""
    agent = raw_agent(running.port, "aws-1")
    weights, spec = model_and_spec()
    hello = pb.Hello(
        cloud="aws",
        name="aws-1",
        tensors=specs_to_proto(spec),
        last_round=-1,
        weights_digest=digest_of(weights),
    )
    agent.send(hello=hello)
    code, details = agent.ended()
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "\n" not in details
    return details


def test_an_agent_with_the_sha256_weights_digest_from_before_v3_is_refused_in_one_line(
    serve, raw_agent
):
    """Its digest would never match ours: resynced, it would be sent the weights again
    every round instead of hearing why."""
    details = _precondition_refusal(serve(), raw_agent, sha256_weights_digest)
    assert "from before 'w3:'" in details and "upgrade the agent" in details


def test_an_agent_speaking_version_1_frames_is_refused_in_one_line(serve, raw_agent):
    """Its uplinks would be refused one by one, and it could not read a broadcast."""
    details = _precondition_refusal(serve(), raw_agent, weights_digest)
    assert "speaks payload frames version 1" in details and "version 2" in details


def test_model_mismatch_is_failed_precondition(serve, raw_agent):
    running = serve()
    agent = raw_agent(running.port, "aws-1")
    _, spec = model_and_spec()
    spec = specs_to_proto(spec)
    spec[0].shape[0] += 1
    agent.send(hello=pb.Hello(cloud="aws", name="aws-1", tensors=spec, last_round=-1))
    code, details = agent.ended()
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "tok.weight" in details


def test_second_contribution_in_one_round_is_refused(serve, raw_agent):
    running = serve(min_agents=2)
    aws, gcp = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(aws, "aws", "aws-1"), join(gcp, "gcp", "gcp-1")
    send(aws, *contribution(deltas(1)))
    assert aws.expect("receipt").receipt.accepted
    send(aws, *contribution(deltas(1)))
    code, details = aws.ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "second contribution" in details


def test_late_contribution_is_refused_in_band_and_the_session_goes_on(serve, raw_agent):
    running = serve(min_agents=2, quorum=1, round_deadline_s=0.3)
    fast, slow = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(fast, "aws", "aws-1"), join(slow, "gcp", "gcp-1")
    send(fast, *contribution(deltas(1)))
    assert slow.expect("round_end").round_end.round == 0
    send(slow, *contribution(deltas(2), round=0))
    receipt = slow.expect("receipt").receipt
    assert not receipt.accepted
    assert receipt.code == grpc.StatusCode.ABORTED.value[0]
    assert "closed" in receipt.message
    send(slow, *contribution(deltas(2), round=1))
    assert slow.expect("receipt").receipt.accepted

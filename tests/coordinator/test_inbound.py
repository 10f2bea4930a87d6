"""A contribution in flight, without gRPC: withdrawn exactly, refused chunks counted off."""

from __future__ import annotations

import torch

from skyfed.compression import make_codec
from skyfed.coordinator.aggregate import RoundAggregate
from skyfed.coordinator.inbound import Inbound
from skyfed.fingerprint import TensorInfo
from skyfed.proto.chunks import Assembler, cut_all, cut_each
from skyfed.wire import ChunkKind, Payload, max_payload_bytes

SPEC = [TensorInfo("w", (32, 16), "float32"), TensorInfo("b", (32,), "float32")]
FP32 = make_codec("fp32")
MAX_CHUNK = 512


def chunks(values: list[torch.Tensor], round_: int = 0):
    payloads = [Payload(i, None, "fp32", FP32.encode(v)) for i, v in enumerate(values)]
    return cut_all(payloads, kind=ChunkKind.GRADIENT, round=round_, max_chunk_bytes=MAX_CHUNK)


def receive(agg: RoundAggregate, values: list[torch.Tensor], upto: int | None = None) -> Inbound:
    cut = chunks(values)
    inbound = Inbound(
        round=0,
        expected=len(cut),
        entry=agg.begin(4),
        assembler=Assembler(
            kind=ChunkKind.GRADIENT,
            round=0,
            num_tensors=len(SPEC),
            max_chunk_bytes=MAX_CHUNK,
            max_payload_bytes=max_payload_bytes(SPEC),
        ),
    )
    for chunk in cut[:upto]:
        payload = inbound.assembler.add(chunk)
        inbound.seen += 1
        if payload is not None:
            inbound.entry.stage(inbound.entry.check(payload))
    return inbound


def test_an_inbound_contribution_withdrawn_half_way_leaves_the_sum_unchanged():
    ones = [torch.ones(t.shape) for t in SPEC]
    alone = RoundAggregate(SPEC)
    receive(alone, ones).entry.commit()
    agg = RoundAggregate(SPEC)
    receive(agg, ones).entry.commit()
    gen = torch.Generator().manual_seed(0)
    half = receive(agg, [torch.randn(t.shape, generator=gen) for t in SPEC], upto=5)
    assert half.open and half.left > 0
    half.withdraw()
    assert not half.open
    for got, want in zip(agg.mean(), alone.mean(), strict=True):
        assert torch.equal(got, want)


def test_a_refused_contribution_discards_exactly_its_own_chunks():
    refused = Inbound(round=3, expected=2)
    later = chunks([torch.ones(t.shape) for t in SPEC], round_=3)
    other = chunks([torch.ones(t.shape) for t in SPEC], round_=4)
    assert not refused.discards(other[0])  # another round's chunk is not its own
    assert refused.discards(later[0]) and refused.discards(later[1])
    assert not refused.discards(later[2])  # its announced count is spent
    assert not refused.open and refused.left == 0


def test_chunks_cut_one_at_a_time_are_the_chunks_cut_at_once():
    payloads = [
        Payload(i, None, "fp32", bytes(n))
        for i, n in enumerate((0, 1, MAX_CHUNK, 3 * MAX_CHUNK + 1))
    ]
    cut = cut_all(payloads, kind=ChunkKind.GRADIENT, round=0, max_chunk_bytes=MAX_CHUNK)
    assert len(cut) == 1 + 1 + 1 + 4  # an empty payload is one chunk
    lazily = cut_each(payloads, kind=ChunkKind.GRADIENT, round=0, max_chunk_bytes=MAX_CHUNK)
    assert [(c.seq, c.tensor, c.part) for c in lazily] == [(c.seq, c.tensor, c.part) for c in cut]

"""The round aggregate: the mean decoded where it goes, bit for bit the decode-then-add
sum, shards in logical coordinates, exact withdrawal, a fixed order."""

from __future__ import annotations

import pytest
import torch

from skyfed.compression import codec_names, decode_add_payload, decode_payload, make_codec
from skyfed.compression.base import BLOCK_NUMEL
from skyfed.coordinator.aggregate import RoundAggregate
from skyfed.errors import BadContributionError, ProtocolError
from skyfed.fingerprint import TensorInfo
from skyfed.wire import Payload

SPEC = [TensorInfo("w", (64, 48), "float32"), TensorInfo("b", (64,), "float32")]
FP32 = make_codec("fp32")
SHARDINGS = [None, [(0, 0, 20), (0, 20, 44)], [(1, 0, 16), (1, 16, 32)]]


def payload(tensor: int, values: torch.Tensor, shard=None, codec=FP32) -> Payload:
    return Payload(tensor, shard, codec.name, bytes(codec.encode(values.contiguous())))


def parts(w: torch.Tensor, b: torch.Tensor, shards=None) -> list[tuple[int, torch.Tensor, object]]:
    if shards is None:
        return [(0, w, None), (1, b, None)]
    return [(0, w.narrow(d, o, n), (d, o, n)) for d, o, n in shards] + [(1, b, None)]


def contribute(agg, samples, w, b, shards=None, codec=FP32, key=""):
    c = agg.begin(samples, key)
    for tensor, values, shard in parts(w, b, shards):
        p = payload(tensor, values, shard, codec)
        c.stage(c.check(p))
    return c


def test_mean_is_weighted_by_samples():
    agg = RoundAggregate(SPEC)
    contribute(agg, 1, torch.ones(64, 48), torch.ones(64), key="a").commit()
    contribute(agg, 3, torch.full((64, 48), 5.0), torch.full((64,), 5.0), key="b").commit()
    w, b = agg.mean()
    assert torch.equal(w, torch.full((64, 48), 4.0)) and torch.equal(b, torch.full((64,), 4.0))


@pytest.mark.parametrize("shards", SHARDINGS, ids=["whole", "rows", "columns"])
@pytest.mark.parametrize("name", codec_names())
def test_decoding_into_the_mean_is_bit_for_bit_decode_then_add(name, shards):
    """The fused path against the plain one: every payload decoded into a new tensor and
    added, in the same (key) order, in float32, then divided by the samples."""
    gen = torch.Generator().manual_seed(3)
    agg = RoundAggregate(SPEC)
    reference = [torch.zeros(t.shape) for t in SPEC]
    # Keys out of arrival order: the sum runs in key order.
    for key, samples in (("gcp", 5), ("aws", 2), ("azure", 7)):
        codec = make_codec(name, seed=[1, samples])
        w, b = torch.randn(64, 48, generator=gen), torch.randn(64, generator=gen)
        c = agg.begin(samples, key)
        for tensor, values, shard in parts(w, b, shards):
            p = payload(tensor, values, shard, codec)
            c.stage(c.check(p))
        c.commit()
    for _key, c in sorted((c.key, c) for c in agg._committed):
        for tensor, payloads in c.staged.items():
            for p in payloads:
                target = reference[tensor]
                if p.shard is not None:
                    target = target.narrow(*p.shard)
                decoded = decode_payload(p.data, shape=tuple(target.shape))
                target.add_(decoded, alpha=c.samples)
    for ours, ref in zip(agg.mean(), reference, strict=True):
        assert torch.equal(ours, ref.div_(14))


def test_the_sum_does_not_depend_on_the_order_contributions_commit_in():
    gen = torch.Generator().manual_seed(5)
    updates = {
        k: (torch.randn(64, 48, generator=gen), torch.randn(64, generator=gen)) for k in "abcd"
    }
    means = []
    for order in ("abcd", "dcba", "cadb"):
        agg = RoundAggregate(SPEC)
        for k in order:
            contribute(agg, 3, *updates[k], key=k).commit()
        means.append(agg.mean())
    assert all(torch.equal(x, y) for m in means[1:] for x, y in zip(m, means[0], strict=True))


@pytest.mark.parametrize("name", codec_names())
def test_a_withdrawn_contribution_leaves_the_sum_exactly_as_without_it(name):
    codec = make_codec(name, seed=[0])
    gen = torch.Generator().manual_seed(9)
    w, b = torch.randn(64, 48, generator=gen), torch.randn(64, generator=gen)
    agg, reference = RoundAggregate(SPEC), RoundAggregate(SPEC)
    same = [payload(t, v, s, codec) for t, v, s in parts(w, b)]  # EC-SGD rounds at random
    for target in (agg, reference):
        c = target.begin(2, "a")
        for p in same:
            c.stage(c.check(p))
        c.commit()
    half = agg.begin(7, "b")  # half-sent, then refused: only its first tensor arrived
    p = payload(0, torch.randn(64, 48, generator=gen) * 1e3, codec=codec)
    half.stage(half.check(p))
    half.withdraw()
    contribute(agg, 5, w * 1e4, b * 0 - 1e6, codec=codec, key="c").withdraw()
    assert all(torch.equal(x, y) for x, y in zip(agg.mean(), reference.mean(), strict=True))
    assert agg.committed == 1 and agg.total_samples == 2


def test_released_tensors_hold_no_payloads():
    agg = RoundAggregate(SPEC)
    c = contribute(agg, 1, torch.ones(64, 48), torch.ones(64))
    c.commit()
    agg.mean_into(0, torch.empty(64, 48))
    agg.release(0)
    assert list(c.staged) == [1]


def test_overlapping_shards_are_refused():
    c = RoundAggregate(SPEC).begin(1)
    c.check(payload(0, torch.zeros(20, 48), (0, 0, 20)))
    with pytest.raises(ProtocolError, match="already sent"):
        c.check(payload(0, torch.zeros(20, 48), (0, 10, 20)))


def test_contribution_with_a_gap_cannot_commit():
    agg = RoundAggregate(SPEC)
    with pytest.raises(BadContributionError, match="without tensors"):
        contribute(agg, 1, torch.zeros(64, 48), torch.zeros(64), [(0, 0, 50)]).commit()


def test_a_payload_of_the_wrong_shape_is_refused_before_it_is_staged():
    c = RoundAggregate(SPEC).begin(1)
    with pytest.raises(BadContributionError, match="shape"):
        c.check(payload(0, torch.zeros(48, 64)))


def test_a_payload_with_inf_is_refused():
    c = RoundAggregate(SPEC).begin(1)
    bad = torch.zeros(64, 48)
    bad[3, 4] = float("inf")
    with pytest.raises(BadContributionError, match="NaN or Inf"):
        c.check(payload(0, bad))


def test_shard_outside_the_tensor_is_refused():
    c = RoundAggregate(SPEC).begin(1)
    with pytest.raises(BadContributionError, match="outside shape"):
        c.check(payload(0, torch.zeros(2, 48), (0, 63, 2)))


def test_lossy_payload_is_summed_as_decoded():
    agg = RoundAggregate(SPEC)
    w = torch.randn(64, 48)
    c = agg.begin(1)
    for p in (payload(0, w, codec=make_codec("fp16")), payload(1, torch.zeros(64))):
        c.stage(c.check(p))
    c.commit()
    assert torch.equal(agg.mean()[0], w.half().float())


def test_the_mean_of_topk_contributions_adds_from_the_checks_parse(monkeypatch):
    """The check on arrival parses each Top-k payload once; the close adds from that
    parse and parses none again, and the mean is bit for bit decode-then-add's."""
    from skyfed.compression.topk import TopK

    parses = []
    parse = TopK._parse
    monkeypatch.setattr(TopK, "_parse", lambda self, *a: parses.append(1) or parse(self, *a))
    gen = torch.Generator().manual_seed(11)
    agg, reference = RoundAggregate(SPEC), [torch.zeros(t.shape) for t in SPEC]
    for key, samples in (("b", 3), ("a", 128), ("c", 5)):
        codec = make_codec("topk", density=0.05, dense_below=0)
        c = agg.begin(samples, key)
        for tensor, values, _ in parts(torch.randn(64, 48, generator=gen), torch.randn(64)):
            p = payload(tensor, values, codec=codec)
            c.stage(c.check(p))
        c.commit()
    checked = len(parses)
    assert checked == 6
    means = agg.mean()
    assert len(parses) == checked  # nothing parsed at the close
    for c in sorted(agg._committed, key=lambda c: c.key):
        for tensor, payloads in c.staged.items():
            for p in payloads:
                decoded = decode_payload(p.data, shape=SPEC[tensor].shape)
                reference[tensor].add_(decoded, alpha=c.samples)
    for ours, ref in zip(means, reference, strict=True):
        assert torch.equal(ours, ref.div_(136))


def test_a_checked_payload_of_a_withdrawn_contribution_keeps_no_parse():
    agg = RoundAggregate(SPEC)
    c = agg.begin(1, "a")
    p = payload(0, torch.randn(64, 48), codec=make_codec("topk", density=0.05))
    checked = c.check(p)
    c.withdraw()
    c.stage(checked)  # staged after the withdrawal: dropped, and its parse with it
    assert not c.staged and not c.kept


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp32"])
def test_the_mean_taken_piece_by_piece_is_bit_for_bit_the_mean_taken_term_by_term(name):
    """The elementwise codecs' mean takes every term of one piece while it is in cache
    (``RoundAggregate._mean_by_pieces``); the sum is the plain loop's, each term over the
    whole tensor in key order then the division, bit for bit: several pieces and a tail,
    a scaled FP16 payload (values under FP16's least normal) with a clipped factor, and
    samples that do not divide evenly."""
    numel = 2 * BLOCK_NUMEL + 1237
    spec = [TensorInfo("w", (numel,), "float32")]
    gen = torch.Generator().manual_seed(11)
    agg = RoundAggregate(spec)
    for key, samples, size, factor in (
        ("gcp", 5, 1.0, 1.0),
        ("aws", 2, 1e-6, 0.3),
        ("azure", 7, 3.0, 1.0),
    ):
        c = agg.begin(samples, key)
        p = payload(0, torch.randn(numel, generator=gen) * size, codec=make_codec(name))
        c.stage(c.check(p))
        c.commit()
        c.scale(factor)
    ours = agg.mean_into(0, torch.full((numel,), float("nan")))
    reference = torch.zeros(numel)
    for c in sorted(agg._committed, key=lambda c: c.key):
        for p in c.staged[0]:
            decode_add_payload(p.data, reference, c.samples * c.factor)
    reference.div_(agg.total_samples)
    assert torch.equal(ours.view(torch.int32), reference.view(torch.int32))

"""The streaming aggregate: weighted mean, shards in logical coordinates, exact withdrawal."""

from __future__ import annotations

import pytest
import torch

from skyfed.compression import make_codec
from skyfed.coordinator.aggregate import RoundAggregate
from skyfed.errors import BadContributionError, ProtocolError
from skyfed.fingerprint import TensorInfo
from skyfed.wire import Payload

SPEC = [TensorInfo("w", (6, 4), "float32"), TensorInfo("b", (6,), "float32")]
FP32 = make_codec("fp32")


def payload(tensor: int, values: torch.Tensor, shard=None, codec=FP32) -> Payload:
    return Payload(tensor, shard, codec.name, codec.encode(values))


def contribute(agg: RoundAggregate, samples: int, w: torch.Tensor, b: torch.Tensor, shards=None):
    c = agg.begin(samples)
    if shards is None:
        parts = [(0, w, None), (1, b, None)]
    else:
        parts = [(0, w.narrow(d, o, n), (d, o, n)) for d, o, n in shards] + [(1, b, None)]
    for tensor, values, shard in parts:
        p = payload(tensor, values.contiguous(), shard)
        c.apply(p, c.check(p))
    return c


def test_mean_is_weighted_by_samples():
    agg = RoundAggregate(SPEC)
    contribute(agg, 1, torch.ones(6, 4), torch.ones(6)).commit()
    contribute(agg, 3, torch.full((6, 4), 5.0), torch.full((6,), 5.0)).commit()
    w, b = agg.mean()
    assert torch.equal(w, torch.full((6, 4), 4.0)) and torch.equal(b, torch.full((6,), 4.0))


@pytest.mark.parametrize(
    "shards", [[(0, 0, 2), (0, 2, 4)], [(1, 0, 1), (1, 1, 3)], [(0, 3, 3), (0, 0, 3)]]
)
def test_shards_in_logical_coordinates_equal_the_whole_tensor(shards):
    w, b = torch.randn(6, 4), torch.randn(6)
    whole, sharded = RoundAggregate(SPEC), RoundAggregate(SPEC)
    contribute(whole, 2, w, b).commit()
    contribute(sharded, 2, w, b, shards).commit()
    assert all(torch.equal(x, y) for x, y in zip(whole.mean(), sharded.mean(), strict=True))


def test_overlapping_shards_are_refused():
    c = RoundAggregate(SPEC).begin(1)
    c.check(payload(0, torch.zeros(3, 4), (0, 0, 3)))
    with pytest.raises(ProtocolError, match="already sent"):
        c.check(payload(0, torch.zeros(3, 4), (0, 2, 3)))


def test_contribution_with_a_gap_cannot_commit():
    agg = RoundAggregate(SPEC)
    with pytest.raises(BadContributionError, match="without tensors"):
        contribute(agg, 1, torch.zeros(6, 4), torch.zeros(6), [(0, 0, 5)]).commit()


def test_shard_outside_the_tensor_is_refused():
    c = RoundAggregate(SPEC).begin(1)
    with pytest.raises(BadContributionError, match="outside shape"):
        c.check(payload(0, torch.zeros(2, 4), (0, 5, 2)))


def test_withdrawn_contribution_leaves_the_sum_as_if_it_never_came():
    agg, reference = RoundAggregate(SPEC), RoundAggregate(SPEC)
    w, b = torch.randn(6, 4), torch.randn(6)
    contribute(agg, 2, w, b).commit()
    contribute(reference, 2, w, b).commit()
    contribute(agg, 7, torch.randn(6, 4) * 1e3, torch.randn(6) * 1e3).withdraw()
    assert all(torch.equal(x, y) for x, y in zip(agg.mean(), reference.mean(), strict=True))
    assert agg.committed == 1


def test_lossy_payload_is_summed_as_decoded():
    agg = RoundAggregate(SPEC)
    w = torch.randn(6, 4)
    c = agg.begin(1)
    for p in (payload(0, w, codec=make_codec("fp16")), payload(1, torch.zeros(6))):
        c.apply(p, c.check(p))
    c.commit()
    assert torch.equal(agg.mean()[0], w.half().float())

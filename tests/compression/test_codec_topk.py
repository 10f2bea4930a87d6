"""Top-k selection returns exactly k elements, the same set torch.topk returns."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skyfed.compression import decode_payload, make_codec
from skyfed.compression.select import TopKSelector


def _topk_set(x: torch.Tensor, k: int) -> set[int]:
    return set(torch.topk(x.abs(), k).indices.tolist())


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 300_000),
    density=st.sampled_from([1e-4, 1e-3, 0.01, 0.05, 0.3, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_selection_is_exactly_the_topk_set(n: int, density: float, seed: int) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))  # distinct values
    k = max(1, round(density * n))
    idx = TopKSelector().select(x, k)
    assert len(idx) == k
    assert torch.all(idx[1:] > idx[:-1])
    assert set(idx.tolist()) == _topk_set(x, k)


@pytest.mark.parametrize("n", [200_000, 2_000_000])
def test_selection_on_large_skewed_tensors(n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen) ** 3  # heavy tails
    x[: n // 2] *= 1e-3  # structured: the first half is small
    k = n // 100
    idx = TopKSelector().select(x, k)
    assert set(idx.tolist()) == _topk_set(x, k)


def test_mostly_zero_tensor_still_sends_exactly_k() -> None:
    x = torch.zeros(500_000)
    x[::50_000] = 1.0  # 10 non-zeros, k = 5000
    codec = make_codec("topk", density=0.01)
    y = decode_payload(codec.encode(x), shape=x.shape)
    assert torch.equal(y, x)


def test_ties_give_exactly_k() -> None:
    x = torch.ones(300_000)
    idx = TopKSelector().select(x, 3000)
    assert len(idx) == 3000 and len(set(idx.tolist())) == 3000


def test_selection_reuses_buffers_across_sizes() -> None:
    selector = TopKSelector()
    for n in (100_000, 200_000, 100_000):
        x = torch.randn(n)
        assert set(selector.select(x, 100).tolist()) == _topk_set(x, 100)


@pytest.mark.parametrize("density", [1e-3, 0.05, 0.2, 0.6])
def test_dense_and_sparse_index_encodings_round_trip(density: float) -> None:
    x = torch.randn(100_000)
    codec = make_codec("topk", density=density, values="fp16")
    y = decode_payload(codec.encode(x), shape=x.shape)
    kept = y != 0
    assert int(kept.sum()) == codec.k_for(x.numel())
    assert torch.allclose(y[kept], x[kept], rtol=2**-10)


def test_downlink_has_room_for_the_union_of_the_uplinks() -> None:
    uplink = make_codec("topk", density=0.01, values="fp16")
    gens = [torch.Generator().manual_seed(s) for s in range(3)]
    sent = [
        decode_payload(uplink.encode(torch.randn(10_000, generator=g)), shape=(10_000,))
        for g in gens
    ]
    mean = sum(sent) / 3
    downlink = uplink.for_downlink(3)
    assert (downlink.density, downlink.values) == (0.03, "fp16")
    assert torch.equal(
        decode_payload(downlink.encode(mean), shape=mean.shape).nonzero(), mean.nonzero()
    )
    assert make_codec("topk", density=0.5).for_downlink(3).density == 1.0
    assert make_codec("fp16").for_downlink(3).name == "fp16"


def test_one_threshold_over_a_set_sends_where_the_update_is_large() -> None:
    gen = torch.Generator().manual_seed(0)
    pending = {
        "loud": torch.randn(20_000, generator=gen),
        "quiet": torch.randn(20_000, generator=gen) * 1e-3,
        "bias": torch.randn(100, generator=gen) * 1e-3,  # under dense_below: goes whole
    }
    codec = make_codec("topk", density=0.01)
    plan = codec.plan(pending)
    kept = {key: c.k_for(pending[key].numel()) for key, c in plan.items()}
    # The set's 1 % (400 of 40,000 sampled whole), all of it in the loud tensor; a tensor
    # with nothing above the threshold still sends its single largest element.
    assert kept == {"loud": 400, "quiet": 1, "bias": 100}
    fp16 = make_codec("fp16")
    assert fp16.plan(pending) == dict.fromkeys(pending, fp16)

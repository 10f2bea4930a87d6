"""Top-k selection keeps the largest magnitudes: at least k, at most k (1 + OVERSHOOT),
fewer only when the rest are zeros; a plan's threshold is kept exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skyfed.compression import decode_payload, make_codec
from skyfed.compression.select import OVERSHOOT, TopKSelector, quantile, true_at
from skyfed.compression.topk import MIN_DENSITY, TopK, min_kept


def _topk_set(x: torch.Tensor, k: int) -> set[int]:
    return set(torch.topk(x.abs(), k).indices.tolist())


def _kept(codec: TopK, x: torch.Tensor) -> int:
    """How many elements ``codec``'s payload of ``x`` keeps (its ``k``, as the frame says)."""
    return codec._parse(codec.encode(x), tuple(x.shape))[1].numel()


def _assert_largest(x: torch.Tensor, idx: torch.Tensor, k: int) -> None:
    """``idx`` is sorted, between k and k (1 + OVERSHOOT) long, and nothing left out is
    larger than anything kept: the exact top-``len(idx)`` set, so the top-k is in it."""
    assert k <= len(idx) <= k * (1 + OVERSHOOT), (k, len(idx))
    assert torch.all(idx[1:] > idx[:-1])
    kept = torch.zeros(x.numel(), dtype=torch.bool)
    kept[idx] = True
    if not kept.all():
        assert float(x.abs()[kept].min()) >= float(x.abs()[~kept].max())


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 300_000),
    density=st.sampled_from([1e-4, 1e-3, 0.01, 0.05, 0.3, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_selection_keeps_the_largest_within_the_overshoot(
    n: int, density: float, seed: int
) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))  # distinct values
    k = max(1, round(density * n))
    _assert_largest(x, TopKSelector().select(x, k), k)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 70_000),
    density=st.sampled_from([0.0, 1e-4, 0.01, 0.05, 0.1, 0.11, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_true_positions_of_a_mask_are_numpys_at_every_density_and_length(
    n: int, density: float, seed: int
) -> None:
    """The word-then-byte search finds exactly ``np.flatnonzero``'s positions, in order,
    whatever the length's remainder over a word and the density (both sides of 10 %)."""
    mask = np.random.default_rng(seed).random(n) < density
    assert np.array_equal(true_at(mask), np.flatnonzero(mask))
    assert np.array_equal(true_at(mask[1:]), np.flatnonzero(mask[1:]))  # an unaligned view


def test_small_or_dense_selections_are_exactly_the_topk_set() -> None:
    for n, k in [(1000, 10), (65_536, 655), (300_000, 90_000)]:
        x = torch.randn(n, generator=torch.Generator().manual_seed(n))
        idx = TopKSelector().select(x, k)
        assert len(idx) == k and set(idx.tolist()) == _topk_set(x, k)


@pytest.mark.parametrize("n", [200_000, 2_000_000])
@pytest.mark.parametrize("density", [0.001, 0.01, 0.05])
def test_selection_on_large_skewed_tensors(n: int, density: float) -> None:
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen) ** 3  # heavy tails
    x[: n // 2] *= 1e-3  # structured: the first half is small
    k = round(n * density)
    _assert_largest(x, TopKSelector().select(x, k), k)


def test_fused_sum_selects_on_the_sum_and_leaves_it_in_place() -> None:
    gen = torch.Generator().manual_seed(1)
    e, g = torch.randn(1_000_000, generator=gen), torch.randn(1_000_000, generator=gen)
    p = e + g
    idx = TopKSelector().select(e, 50_000, add_N=g)
    assert torch.equal(e, p)
    _assert_largest(p, idx, 50_000)


def test_mostly_zero_tensor_sends_its_non_zeros_only() -> None:
    """Fewer non-zeros than k: the top-k would add only zeros (a mean of sparse uplinks
    before any residual); the selection keeps the non-zeros, with no sort."""
    x = torch.zeros(500_000)
    x[::50_000] = 1.0  # 10 non-zeros, k = 5000
    codec = make_codec("topk", density=0.01)
    assert torch.equal(TopKSelector().select(x.clone(), 5000), torch.arange(0, 500_000, 50_000))
    y = decode_payload(codec.encode(x), shape=x.shape)
    assert torch.equal(y, x)


def test_a_dense_k_over_a_sparser_mean_keeps_its_non_zeros_without_a_full_topk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broadcast of 8 agents' 5 % uplinks: k is 40 % of the tensor and the mean has
    about 34 % non-zeros. The selection keeps exactly those, the sum fused, and never
    reaches torch.topk (copies of the tensor's size: the close's memory budget)."""
    import skyfed.compression.select as select

    n, gen = 1_000_000, torch.Generator().manual_seed(3)
    e, g = torch.zeros(n), torch.zeros(n)
    for _ in range(4):
        e[torch.randperm(n, generator=gen)[: n // 20]] = 1.0
        g[torch.randperm(n, generator=gen)[: n // 20]] = 2.0
    p = e + g

    def refuse(flat_N: torch.Tensor, k: int) -> None:
        raise AssertionError("the exact top-k ran")

    monkeypatch.setattr(select, "_exact", refuse)
    idx = TopKSelector().select(e, 400_000, add_N=g)
    assert torch.equal(e, p)
    assert torch.equal(idx, torch.nonzero(p).view(-1))


def test_ties_that_no_threshold_can_split_give_exactly_k() -> None:
    x = torch.ones(300_000)
    idx = TopKSelector().select(x, 3000)
    assert len(idx) == 3000 and len(set(idx.tolist())) == 3000
    x[:100] = 2.0  # 100 above, 299,900 tied below: the threshold lands on the ties
    idx = TopKSelector().select(x, 3000)
    assert len(idx) == 3000 and set(range(100)) <= set(idx.tolist())


def test_selection_reuses_buffers_across_sizes() -> None:
    selector = TopKSelector()
    for n in (100_000, 200_000, 100_000):
        x = torch.randn(n)
        _assert_largest(x, selector.select(x, 100), 100)


@pytest.mark.parametrize("density", [1e-3, 0.05, 0.2, 0.6])
def test_dense_and_sparse_index_encodings_round_trip(density: float) -> None:
    x = torch.randn(100_000)
    codec = make_codec("topk", density=density, values="fp16")
    y = decode_payload(codec.encode(x), shape=x.shape)
    kept, k = y != 0, codec.k_for(x.numel())
    assert k <= int(kept.sum()) <= k * (1 + OVERSHOOT)
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
    kept = {key: _kept(c, pending[key]) for key, c in plan.items()}
    # The set's 1 % (400 of 40,000 sampled whole), all of it in the loud tensor; a tensor
    # with nothing above the threshold still sends its single largest element.
    assert kept == {"loud": 400, "quiet": 1, "bias": 100}
    fp16 = make_codec("fp16")
    assert fp16.plan(pending) == dict.fromkeys(pending, fp16)


def test_a_planned_tensor_keeps_torchs_count_at_the_threshold() -> None:
    """Each tensor's k is counted by its selection's pass: torch's count, ties and a
    tensor that is not contiguous included (nothing above the threshold: min_kept)."""
    gen = torch.Generator().manual_seed(5)
    for v in (
        torch.randn(700_000, generator=gen),
        torch.randn(600, 1000, generator=gen).round(),  # ties at the threshold
        torch.randn(1000, 600, generator=gen).t(),  # not contiguous
    ):
        for t in (0.5, 1.0, 2.5, 9.0):
            planned = make_codec("topk", density=0.01)
            planned._threshold = t
            count = int(torch.count_nonzero(v.abs() >= t))
            assert _kept(planned, v) == max(count, min_kept(v.numel())), t


def test_a_planned_tensor_keeps_exactly_what_is_at_or_above_the_sets_threshold() -> None:
    """The plan counted each tensor at one threshold; the selection keeps that set, even
    at a density where it would otherwise sort (over 20 %)."""
    gen = torch.Generator().manual_seed(7)
    pending = {
        "loud": torch.randn(400_000, generator=gen) * 2.0,
        "quiet": torch.randn(400_000, generator=gen),
    }
    plan = make_codec("topk", density=0.15).plan(pending)
    threshold = plan["loud"]._threshold
    assert threshold is not None and plan["quiet"]._threshold == threshold
    assert _kept(plan["loud"], pending["loud"]) > 0.2 * pending["loud"].numel()
    for key, codec in plan.items():
        x = pending[key]
        y = decode_payload(codec.encode(x), shape=x.shape)
        assert torch.equal(y != 0, x.abs() >= threshold), key
        assert int((y != 0).sum()) == _kept(codec, x)


def test_a_planned_tensor_with_nothing_above_the_threshold_still_decodes() -> None:
    """Its density falls to MIN_DENSITY; k is never below what the decoder accepts (2 of
    2,496,400 elements, a 1580 x 1580 layer, was refused)."""
    gen = torch.Generator().manual_seed(8)
    pending = {
        "loud": torch.randn(100_000, generator=gen),
        "quiet": torch.randn(1580, 1580, generator=gen) * 1e-6,
    }
    codec = make_codec("topk", density=0.01).plan(pending)["quiet"]
    k = _kept(codec, pending["quiet"])
    assert k == min_kept(pending["quiet"].numel()) >= pending["quiet"].numel() * MIN_DENSITY
    y = decode_payload(codec.encode(pending["quiet"]), shape=(1580, 1580))
    assert int((y != 0).sum()) == k


@pytest.mark.parametrize("zeros", [0.0, 0.4, 0.6, 0.85, 1.0])
def test_the_quantile_of_a_mostly_zero_sample_is_the_sorted_samples(zeros: float) -> None:
    """The rank-th largest, as a sort gives it, whether or not the sample is mostly zeros
    (which the quantile partitions without), and zero where the rank reaches them."""
    gen = torch.Generator().manual_seed(11)
    sample = torch.randn(50_000, generator=gen).abs()
    sample[torch.rand(50_000, generator=gen) < zeros] = 0.0
    ordered = sample.sort(descending=True).values
    for rank in (1, 7, 5_000, 10_000, 20_000, 49_999, 50_000, 80_000):
        want = float(ordered[min(rank, len(ordered)) - 1])
        assert quantile(sample.clone(), rank) == want, rank

"""Every codec round-trips any shape within its error bound, deterministically."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skyfed.compression import (
    codec_names,
    decode_payload,
    frame,
    make_codec,
    payload_codec,
    rounding_seed,
)
from skyfed.compression.fp import Fp16

CODECS = [
    ("fp32", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("topk", {"density": 0.01}),
    ("topk", {"density": 0.3, "values": "fp16"}),
    ("topk", {"density": 0.05, "bits": 2}),
    ("topk", {"density": 0.2, "bits": 3, "dense_below": 0}),
    ("topk", {"density": 0.01, "bits": 4}),
    ("ecsgd", {"bits": 1}),
    ("ecsgd", {"bits": 2, "block": 64}),
    ("ecsgd", {"bits": 4, "seed": 1}),
]
shapes = st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple)
magnitudes = st.sampled_from([0.0, 1e-30, 1e-6, 1.0, 1e4, 1e30])


def _tensor(shape: tuple[int, ...], magnitude: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen) * magnitude


def test_every_named_codec_is_registered() -> None:
    assert codec_names() == ["fp32", "fp16", "bf16", "topk", "ecsgd"]


@pytest.mark.parametrize(("name", "params"), CODECS)
@settings(max_examples=25, deadline=None)
@given(shape=shapes, magnitude=magnitudes, seed=st.integers(0, 2**16))
def test_round_trip_keeps_shape_and_error_bound(
    name: str, params: dict, shape: tuple[int, ...], magnitude: float, seed: int
) -> None:
    codec = make_codec(name, **params)
    x = _tensor(shape, magnitude, seed)
    payload = codec.encode(x)
    y = decode_payload(payload, shape=x.shape)
    assert payload_codec(payload) == name
    assert y.shape == x.shape and y.dtype == torch.float32
    assert torch.isfinite(y).all()
    if x.numel():
        assert _error(x, y) <= _bound(name, params, x)


def _error(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x.double() - y.double()).norm())


def _bound(name: str, params: dict, x: torch.Tensor) -> float:
    """Per codec: how far ``D(C(x))`` may be from ``x`` in L2."""
    norm = float(x.double().norm())
    peak = float(x.abs().max())
    tiny = 1e-37 * math.sqrt(x.numel())  # below FP32/FP16 normal range: flushes allowed
    if name == "fp32":
        return 0.0
    if name in ("fp16", "bf16"):
        return norm * (2**-10 if name == "fp16" else 2**-7) + tiny
    if name == "topk":
        # Dropped elements are the smallest: at most sqrt(n - k) * (k-th magnitude), plus
        # the value rounding (INT8: half a step of peak / 127 per kept element; low bits:
        # half a step of at most peak / (2**(bits - 1) - 1)).
        levels = 254 if params.get("bits", 8) == 8 else 2 * (2 ** (params["bits"] - 1) - 1)
        return norm + peak * math.sqrt(x.numel()) / levels + tiny
    return norm * 2 + peak * math.sqrt(x.numel()) + tiny  # quantization noise of one step


@pytest.mark.parametrize(("name", "params"), CODECS)
def test_decode_is_deterministic_and_ignores_decoder_parameters(name: str, params: dict) -> None:
    x = _tensor((3, 1000), 1.0, 0)
    payload = make_codec(name, **params).encode(x)
    other = make_codec(name)  # default parameters
    first = decode_payload(payload, shape=(3, 1000))
    assert torch.equal(first, other.decode(payload, shape=(3, 1000)))
    assert torch.equal(first, decode_payload(payload, out=torch.empty(3, 1000)))


def test_topk_keeps_the_exact_values_that_fp16_can_carry() -> None:
    x = torch.zeros(1000)
    x[[3, 500, 999]] = torch.tensor([1.5, -2.0, 0.25])
    y = decode_payload(make_codec("topk", density=0.003, values="fp16").encode(x), shape=x.shape)
    assert torch.equal(x, y)


def test_fp16_large_gradients_are_scaled_not_overflowed() -> None:
    x = torch.tensor([1e6, -3e9, 1.0, 0.0])
    y = decode_payload(Fp16().encode(x), shape=x.shape)
    assert torch.isfinite(y).all()
    assert torch.allclose(y, x, rtol=2**-10, atol=3e9 * 2**-11)


def test_fp16_gradient_sized_tensors_are_a_plain_cast() -> None:
    """The fast path: no scale pass when neither overflow nor underflow threatens."""
    x = torch.randn(4096) * 1e-3  # peak ~4e-3: above FP16's normal range floor (2**-14)
    payload = Fp16().encode(x)
    (scale,) = struct.unpack("<f", frame.unpack(payload, max_body=0).params)
    assert scale == 1.0
    assert torch.equal(decode_payload(payload, shape=x.shape), x.half().float())
    assert (
        float((decode_payload(payload, shape=x.shape) - x).abs().max())
        <= float(x.abs().max()) * 2**-11
    )


def test_fp16_tiny_gradients_keep_their_precision() -> None:
    x = torch.randn(1000) * 1e-8  # mostly below FP16's normal range without scaling
    y = decode_payload(Fp16().encode(x), shape=x.shape)
    assert _error(x, y) <= float(x.norm()) * 2**-10


@pytest.mark.parametrize(("bits", "clip"), [(2, 0.0), (2, 1.5), (4, 0.0), (4, 2.5)])
def test_ecsgd_rounding_is_unbiased_within_the_scale_and_clips_beyond(
    bits: int, clip: float
) -> None:
    x = _tensor((4096,), 1.0, 3)
    codec = make_codec("ecsgd", bits=bits, block=256, clip=clip, seed=7)
    mean = torch.stack([codec.decode(codec.encode(x), shape=x.shape) for _ in range(400)]).mean(0)
    blocks = x.view(-1, 256)
    scale = blocks.abs().amax(1)
    if clip:
        scale = torch.minimum(scale, clip * blocks.pow(2).mean(1).sqrt())
    s = scale.repeat_interleave(256)
    inside = x.abs() <= s
    step = 2 * s / (2**bits - 1)
    assert float(((mean - x).abs() / step)[inside].mean()) < 0.05
    assert torch.allclose(mean[~inside], x[~inside].sign() * s[~inside], rtol=1e-5)
    assert bool(inside.all()) == (clip == 0.0)  # N(0, 1) blocks of 256 exceed 2.5 RMS


def test_ecsgd_seed_makes_encoding_reproducible() -> None:
    x = _tensor((5000,), 1.0, 4)
    a = make_codec("ecsgd", bits=2, seed=11).encode(x)
    b = make_codec("ecsgd", bits=2, seed=11).encode(x)
    assert a == b


def test_ecsgd_rounding_differs_between_senders_ranks_and_rounds() -> None:
    """Alike dither would round every sender's errors alike: they would not average out."""
    x = _tensor((5000,), 1.0, 4)
    seeds = [
        rounding_seed(0, "aws-1", 3),
        rounding_seed(0, "gcp-1", 3),
        rounding_seed(0, "aws-1", 3, rank=1),
        rounding_seed(0, "aws-1", 4),
        rounding_seed(1, "aws-1", 3),
    ]
    payloads = {make_codec("ecsgd", bits=2, seed=s).encode(x) for s in seeds}
    assert len(payloads) == len(seeds)


@pytest.mark.parametrize(
    ("name", "params", "floor"),
    [
        ("topk", {"density": 0.01}, 100.0),
        ("topk", {"density": 0.01, "bits": 2}, 250.0),
        ("ecsgd", {"bits": 2}, 15.0),
        ("ecsgd", {"bits": 1}, 30.0),
    ],
)
def test_wire_ratio_meets_its_floor(name: str, params: dict, floor: float) -> None:
    x = _tensor((1 << 20,), 1.0, 5)
    payload = make_codec(name, **params).encode(x)
    assert 4 * x.numel() / len(payload) >= floor


@pytest.mark.parametrize("bits", [1, 2, 4])
@pytest.mark.parametrize("n", [1, 7, 33, 1023, 1025, 2100])
def test_ecsgd_codes_a_ragged_last_block_at_its_own_length(bits: int, n: int) -> None:
    codec = make_codec("ecsgd", bits=bits, block=1024)
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    payload = codec.encode(x)
    f = frame.unpack(payload, max_body=0, shape=(n,))
    blocks = -(-n // 1024)
    assert len(f.body) == 4 * blocks + math.ceil(n * bits / 8)  # scales, then codes
    # Decoded whole and added block by block, the ragged block's codes read alike.
    y = decode_payload(payload, shape=(n,))
    assert torch.equal(codec.decode_add(payload, torch.zeros(n)), y)
    scale = float(x.abs().max())
    assert float((y - x).abs().max()) <= 2 * scale + 1e-6

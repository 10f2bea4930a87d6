"""Decoding into where the data goes: ``decode_add`` and ``decode(out=)`` give bit for bit
what a fresh decode added in gives, for every codec, shards and float64 included; the
fused ``encode_with_feedback`` gives the payload and residual of the unfused rule."""

from __future__ import annotations

import pytest
import torch

from skyfed.compression import (
    PayloadError,
    check_payload,
    check_payload_parsed,
    decode_add_payload,
    make_codec,
)
from skyfed.compression.base import BLOCK_NUMEL
from skyfed.compression.frame import PayloadBuffer

CODECS = [
    ("fp32", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("topk", {"density": 0.01}),
    ("topk", {"density": 0.3, "values": "fp16"}),
    ("topk", {"density": 0.05, "bits": 2}),
    ("topk", {"density": 0.05, "bits": 3}),
    ("ecsgd", {"bits": 1}),
    ("ecsgd", {"bits": 2, "block": 64, "seed": 0}),
    ("ecsgd", {"bits": 4, "block": 1000, "seed": 0}),  # blocks that do not divide a piece
]
ALPHAS = [1.0, -1.0, 0.37, -2.5e3, 128.0, -0.5]  # exact and inexact multiples alike


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns, so equality is bit for bit (NaN and -0.0 included)."""
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def _reference(codec, payload: bytes, acc: torch.Tensor, alpha: float) -> torch.Tensor:
    return acc.clone().add_(codec.decode(payload, shape=tuple(acc.shape)), alpha=alpha)


def _randn(*shape: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize(("name", "params"), CODECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decode_add_equals_adding_a_fresh_decode_bit_for_bit(name, params, dtype) -> None:
    codec = make_codec(name, **params)
    for shape in [(), (1,), (7, 300), (3, 5, 77), (2 * BLOCK_NUMEL + 777,)]:
        payload = codec.encode(_randn(*shape, seed=1) * 1e-2)
        for alpha in ALPHAS:
            acc = _randn(*shape, seed=2, dtype=dtype)
            expected = _reference(codec, payload, acc, alpha)
            assert codec.decode_add(payload, acc, alpha) is acc
            assert torch.equal(_bits(acc), _bits(expected)), (shape, alpha)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_scaled_fp16_payload_decodes_in_bit_for_bit_with_its_scale_in_alpha(dtype) -> None:
    """Values under FP16's least normal travel scaled (``s = 2**k``); their decode-add
    folds ``s`` into ``alpha`` in one pass, and must give what a fresh decode gives."""
    codec = make_codec("fp16")
    for shape in [(7, 300), (2 * BLOCK_NUMEL + 777,)]:
        payload = codec.encode(_randn(*shape, seed=3) * 1e-7)
        for alpha in [*ALPHAS, 3.0e-38, 1.0e38, 0.0]:  # the last three: the slow path
            acc = _randn(*shape, seed=4, dtype=dtype) * 1e-6
            expected = _reference(codec, payload, acc, alpha)
            codec.decode_add(payload, acc, alpha)
            assert torch.equal(_bits(acc), _bits(expected)), (shape, alpha)


@pytest.mark.parametrize(("name", "params"), CODECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decode_add_into_a_shard_view_touches_only_the_shard(name, params, dtype) -> None:
    codec = make_codec(name, **params)
    cases = [
        ((6, 400), 0, 2, 3),  # rows: the view is contiguous
        ((6, 400), 1, 37, 300),  # columns: strided rows
        ((4, 30, 50), 1, 5, 20),  # a middle dim
        ((3, BLOCK_NUMEL + 20), 1, 5, BLOCK_NUMEL + 3),  # rows larger than a piece
        ((BLOCK_NUMEL + 99, 3), 1, 1, 1),  # one strided column, longer than a piece
    ]
    for full_shape, dim, start, length in cases:
        full = _randn(*full_shape, seed=3, dtype=dtype)
        shard = full.narrow(dim, start, length)
        payload = codec.encode(_randn(*shard.shape, seed=4))
        expected = full.clone()
        expected.narrow(dim, start, length).add_(
            codec.decode(payload, shape=tuple(shard.shape)), alpha=-0.5
        )
        decode_add_payload(payload, shard, alpha=-0.5)
        assert torch.equal(_bits(full), _bits(expected)), (full_shape, dim)


@pytest.mark.parametrize(("name", "params"), CODECS)
def test_decode_into_a_reused_buffer_equals_a_fresh_decode(name, params) -> None:
    codec = make_codec(name, **params)
    buffer = torch.full((7, 300), float("nan"))
    for seed in range(3):
        payload = codec.encode(_randn(7, 300, seed=seed))
        assert codec.decode(payload, out=buffer) is buffer
        assert torch.equal(_bits(buffer), _bits(codec.decode(payload, shape=(7, 300))))


def test_decode_add_refuses_an_accumulator_of_another_dtype() -> None:
    payload = make_codec("fp16").encode(torch.ones(4))
    with pytest.raises(ValueError, match="float32 or float64"):
        decode_add_payload(payload, torch.zeros(4, dtype=torch.float16))


def _fp16_inputs() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    n = 2 * BLOCK_NUMEL + 12_345  # three blocks, the last ragged
    g, e = _randn(n, seed=5), _randn(n, seed=6) * 1e-3
    overflow = g.clone()
    overflow[BLOCK_NUMEL + 10] = 1e6  # only the second block overflows FP16
    return {
        "plain": (g, e),
        "overflow in the second block": (overflow, e),
        "underflow everywhere": (g * 1e-7, e * 1e-7),
        "underflow but for a peak that rounds up to FP16's normal range": _rounding_up(g, e),
        "zeros": (torch.zeros(n), torch.zeros(n)),
        "nan": (torch.where(g > 3, float("nan"), g), e),
        "empty": (torch.zeros(0), torch.zeros(0)),
    }


def _rounding_up(g: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiny values but one just under ``2**-14`` (FP16's least normal), which FP16 rounds
    up to it: the plain cast holds, decided on the input's peak as on the wire's."""
    g, e = g * 1e-7, e * 1e-7
    g[BLOCK_NUMEL + 5], e[BLOCK_NUMEL + 5] = 2.0**-14 - 2.0**-26, 0.0
    return g, e


@pytest.mark.parametrize("case", list(_fp16_inputs()))
@pytest.mark.parametrize("name", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("into_buffer", [True, False])
def test_fused_feedback_gives_the_payload_and_residual_of_the_plain_rule(
    case, name, with_residual, into_buffer
) -> None:
    """Encoding with feedback in blocks (FP16: the peak found first, then one cast; FP32
    and BF16: the plain cast in one loop) gives the plain rule's payload and residual,
    bit for bit."""
    g, e = _fp16_inputs()[case]
    codec = make_codec(name)
    p = g + e if with_residual else g
    expected_payload = codec.encode(p)
    expected_residual = p - codec.decode(expected_payload, shape=tuple(p.shape))
    residual = e.clone() if with_residual else None
    out = PayloadBuffer() if into_buffer else None
    payload, new_residual = codec.encode_with_feedback(g, residual, out=out)
    assert bytes(payload) == expected_payload
    assert torch.equal(_bits(new_residual), _bits(expected_residual))
    if with_residual:
        assert new_residual.data_ptr() == residual.data_ptr()  # e' in the residual's memory


@pytest.mark.parametrize(("name", "params"), CODECS)
def test_feedback_keeps_e_prime_equal_to_p_minus_what_the_receiver_decodes(name, params) -> None:
    codec = make_codec(name, **params)
    g, e = _randn(3, 1000, seed=7), _randn(3, 1000, seed=8) * 0.1
    p = g + e
    payload, new_residual = codec.encode_with_feedback(g, e.clone())
    acc = torch.zeros(3, 1000)
    codec.decode_add(payload, acc)
    assert torch.equal(new_residual, p - acc)


@pytest.mark.parametrize("numel", [5000, 300_000])
def test_top_k_decodes_into_a_models_parameter(numel: int) -> None:
    """An agent applies the broadcast straight to its weights (nn.Parameter, no_grad)."""
    codec = make_codec("topk", density=0.05)
    payload = bytes(codec.encode(torch.randn(numel, generator=torch.Generator().manual_seed(2))))
    weights = torch.nn.Parameter(torch.randn(numel))
    want = weights.detach().clone().add_(codec.decode(payload, shape=(numel,)), alpha=-1.0)
    with torch.no_grad():
        codec.decode_add(payload, weights, -1.0)
    assert torch.equal(weights.detach(), want)


@pytest.mark.parametrize(("name", "params"), CODECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adding_the_checks_parse_is_decode_add_bit_for_bit(name, params, dtype) -> None:
    """What the coordinator's check on arrival keeps (``check_payload_parsed``) adds in
    exactly what ``decode_add`` of the payload adds, whole and into a shard's strided
    view, at every alpha (the power-of-two ``index_add_`` and the gather-add-scatter)."""
    codec = make_codec(name, **params)
    cases = [((7, 300), None), ((2 * BLOCK_NUMEL + 777,), None), ((6, 400), (1, 37, 300))]
    for full_shape, shard in cases:
        full = _randn(*full_shape, seed=5, dtype=dtype)
        target = full if shard is None else full.narrow(*shard)
        payload = bytes(codec.encode(_randn(*target.shape, seed=6) * 1e-2))
        squares, parsed = check_payload_parsed(payload, shape=tuple(target.shape))
        assert squares == check_payload(payload, shape=tuple(target.shape))
        if name != "topk":
            assert parsed is None  # a dense parse is the tensor: nothing is kept
            continue
        assert parsed is not None
        for alpha in ALPHAS:
            expected = full.clone()
            decode_add_payload(
                payload, expected if shard is None else expected.narrow(*shard), alpha
            )
            target = full if shard is None else full.narrow(*shard)
            assert parsed.add_into(target, alpha) is target
            assert torch.equal(_bits(full), _bits(expected)), (full_shape, shard, alpha)
            full.copy_(_randn(*full_shape, seed=5, dtype=dtype))


def test_a_kept_parse_refuses_an_accumulator_of_another_shape() -> None:
    payload = bytes(make_codec("topk", density=0.05).encode(_randn(7, 300)))
    _, parsed = check_payload_parsed(payload, shape=(7, 300))
    assert parsed is not None
    with pytest.raises(PayloadError, match="shape"):
        parsed.add_into(torch.zeros(300, 7))

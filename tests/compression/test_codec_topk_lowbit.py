"""Top-k with 2-4 bit values: each within half a step of its block's levels, everything
not sent kept by error feedback, malformed frames refused, version-1 frames named."""

from __future__ import annotations

import dataclasses
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skyfed.compression import PayloadError, decode_payload, frame, make_codec
from skyfed.compression.lowbit import DEFAULT_BLOCK
from skyfed.compression.policy import PolicyConfig
from skyfed.compression.spec import codec_from_spec, parse_spec
from skyfed.compression.topk import Params

BITS = [2, 3, 4]


def _kept(codec, payload: bytes, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The frame's kept indices and decoded values, in index order."""
    _, idx_k, values_k = codec._parse(payload, shape)
    return idx_k, values_k


@pytest.mark.parametrize("bits", BITS)
@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 20_000),
    density=st.sampled_from([0.001, 0.01, 0.05, 0.3, 1.0]),
    magnitude=st.sampled_from([1e-20, 1e-4, 1.0, 1e6]),
    seed=st.integers(0, 2**16),
)
def test_every_kept_value_is_within_half_a_step_of_its_block(bits, n, density, magnitude, seed):
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * magnitude
    codec = make_codec("topk", density=density, bits=bits, dense_below=0)
    payload = codec.encode(x)
    idx_k, values_k = _kept(codec, payload, (n,))
    kept_k = x[idx_k]
    assert torch.equal(torch.sign(values_k) * (values_k != 0), torch.sign(kept_k) * (values_k != 0))
    floor = float(kept_k.abs().min())
    levels = 2 ** (bits - 1) - 1
    for start in range(0, len(kept_k), DEFAULT_BLOCK):
        block = kept_k[start : start + DEFAULT_BLOCK]
        half_step = (float(block.abs().max()) - floor) / (2 * levels)
        error = float((block - values_k[start : start + DEFAULT_BLOCK]).abs().max())
        assert error <= half_step * (1 + 1e-5) + 1e-6 * float(block.abs().max()), (start, bits)


@pytest.mark.parametrize("bits", BITS)
def test_the_residual_keeps_everything_not_sent_over_many_rounds(bits: int) -> None:
    codec = make_codec("topk", density=0.05, bits=bits)
    gen = torch.Generator().manual_seed(bits)
    fed, sent = torch.zeros(20_000, dtype=torch.float64), torch.zeros(20_000, dtype=torch.float64)
    residual = torch.zeros(20_000)
    for _ in range(50):
        g = torch.randn(20_000, generator=gen)
        p = g + residual
        payload, residual = codec.encode_with_feedback(g, residual)
        decoded = decode_payload(payload, shape=(20_000,))
        assert torch.equal(residual, p - decoded)  # e' = p - D(c), exactly
        fed += g
        sent += decoded
    assert torch.allclose(sent + residual.double(), fed, atol=1e-3)


def test_fewer_bits_send_fewer_bytes_at_the_same_density() -> None:
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0))
    size = {b: len(make_codec("topk", density=0.05, bits=b).encode(x)) for b in (2, 3, 4, 8)}
    assert size[2] < size[3] < size[4] < size[8]
    assert size[8] / size[2] > 1.4


def _lowbit_frame(bits: int = 2) -> tuple[bytes, frame.Frame]:
    x = torch.randn(4000, generator=torch.Generator().manual_seed(1))
    payload = make_codec("topk", density=0.1, bits=bits).encode(x)
    return payload, frame.unpack(payload, max_body=0)


def _with_params(f: frame.Frame, params: bytes, body: bytes | memoryview | None = None) -> bytes:
    return frame.pack(f.codec, f.shape, params, f.body if body is None else body)


@pytest.mark.parametrize("wrong", [0, 1, 5, 8, 255])
def test_a_frame_with_an_unknown_width_is_refused(wrong: int) -> None:
    _, f = _lowbit_frame()
    params = dataclasses.replace(Params.unpack(f.params), bits=wrong).pack()
    with pytest.raises(PayloadError, match="low-bit parameters"):
        decode_payload(_with_params(f, params), shape=f.shape)


def test_a_frame_claiming_another_width_or_block_is_refused() -> None:
    _, f = _lowbit_frame(bits=2)
    p = Params.unpack(f.params)
    for bits, block in [(3, DEFAULT_BLOCK), (4, DEFAULT_BLOCK), (2, 64), (2, 0)]:
        params = dataclasses.replace(p, bits=bits, block=block).pack()
        with pytest.raises(PayloadError):
            decode_payload(_with_params(f, params), shape=f.shape)


def test_a_frame_whose_counts_disagree_is_refused() -> None:
    _, f = _lowbit_frame()
    p = Params.unpack(f.params)
    for other_k in (p.k - 1, p.k + 1, p.k + 8, 2 * p.k):
        with pytest.raises(PayloadError):
            decode_payload(_with_params(f, dataclasses.replace(p, k=other_k).pack()), shape=f.shape)
    without_lowbit = dataclasses.replace(p, value_kind=0).pack()
    lowbit_kind_alone = bytes((f.params[0],)) + without_lowbit[1:]  # kind 2, no bits or block
    with pytest.raises(PayloadError, match="parameter bytes"):
        decode_payload(_with_params(f, lowbit_kind_alone), shape=f.shape)


def test_block_scales_below_the_floor_or_not_finite_are_refused() -> None:
    _, f = _lowbit_frame()
    for bad in (-1.0, 0.0, float("inf"), float("nan")):
        body = bytearray(f.body)
        body[4:8] = struct.pack("<f", bad)  # the second block's scale
        with pytest.raises(PayloadError, match="scales"):
            decode_payload(_with_params(f, f.params, body), shape=f.shape)


# Made by the Top-k codec before low-bit values existed (frame layout 1), commit 58e6efb:
# TopK(density=0.2, dense_below=0) and values="fp16" of linspace(-1, 1, 40).reshape(5, 8)**3.
OLD_INT8 = bytes.fromhex(
    "534b46440103000205000000000000000800000000000000180000000001000008000000000000000402013c0500"
    "0000000000008194a4b34d5c6c7f0f000000f0"
)
OLD_FP16 = bytes.fromhex(
    "534b46440103000205000000000000000800000000000000180000000101000008000000000000000000803805"
    "0000000000000000f4d5f2c8f1d9f0d970c871d57200740f000000f0"
)


@pytest.mark.parametrize(("old", "values"), [(OLD_INT8, "int8"), (OLD_FP16, "fp16")])
def test_version_1_frames_are_refused_naming_the_upgrade_and_their_sections_are_kept(
    old, values
) -> None:
    x = torch.linspace(-1, 1, 40).reshape(5, 8) ** 3
    with pytest.raises(PayloadError, match="version-1 frame.*upgrade"):
        decode_payload(old, shape=(5, 8))
    new = make_codec("topk", density=0.2, dense_below=0, values=values).encode(x)
    # The same values and index sections: only the header and the parameters shrank.
    # Version 1: magic, version, codec, flags, ndim, 2 dims u64, params_len u32, 24 bytes.
    old_params = old[28:52]
    old_body = old[52:]
    f = frame.unpack(new, max_body=0, shape=(5, 8))
    assert bytes(f.body) == old_body
    assert len(new) - len(f.body) == 16  # version 1: 52 bytes before the body
    p = Params.unpack(f.params)
    assert (p.value_kind, p.index_kind, p.zstd, p.k) == (
        old_params[0],
        old_params[1],
        old_params[2],
        int.from_bytes(old_params[4:12], "little"),
    )
    y = decode_payload(new, shape=(5, 8))
    kept = y != 0
    assert int(kept.sum()) == 8
    assert torch.allclose(y[kept], x[kept], rtol=2**-6)


def test_the_policy_and_specs_can_pick_low_bit_values() -> None:
    assert PolicyConfig(topk_bits=2).codec_params("topk") == {
        "density": 0.05,
        "values": "int8",
        "bits": 2,
    }
    assert "bits" not in PolicyConfig().codec_params("topk")  # INT8 as before
    with pytest.raises(ValueError, match="topk_bits"):
        PolicyConfig(topk_bits=5)
    with pytest.raises(ValueError, match="topk_bits"):
        PolicyConfig(topk_bits=2, topk_values="fp16")
    assert parse_spec("topk:bits=2,density=0.01") == ("topk", {"bits": 2, "density": 0.01})
    codec = codec_from_spec("topk:bits=3")
    assert (codec.name, codec.bits) == ("topk", 3)
    assert codec.for_downlink(3).bits == 3 and all(c.bits == 3 for c in codec.plan({}).values())
    with pytest.raises(ValueError):
        codec_from_spec("topk:bits")
    with pytest.raises(ValueError):
        codec_from_spec("topk:bits=5")

"""Encoding into a caller-owned buffer gives the same payload as bytes, without new memory."""

from __future__ import annotations

import pytest
import torch

from skyfed.compression import decode_payload, make_codec
from skyfed.compression.frame import PayloadBuffer

from .test_codec_roundtrip import CODECS


@pytest.mark.parametrize(("name", "params"), CODECS)
def test_payload_in_a_buffer_equals_the_bytes_payload(name: str, params: dict) -> None:
    x = torch.randn(3, 3000, generator=torch.Generator().manual_seed(0)) * 1e-3
    params = {**params, "seed": 0} if name == "ecsgd" else params  # same rounding draws
    buffer = PayloadBuffer()
    in_buffer = make_codec(name, **params).encode(x, out=buffer)
    assert bytes(in_buffer) == make_codec(name, **params).encode(x)
    assert torch.equal(
        decode_payload(in_buffer, shape=x.shape), decode_payload(bytes(in_buffer), shape=x.shape)
    )


def test_buffer_payload_is_reused_memory_until_it_must_grow() -> None:
    codec, buffer = make_codec("fp16"), PayloadBuffer()
    first = codec.encode(torch.ones(1000), out=buffer)
    second = codec.encode(torch.ones(500), out=buffer)
    assert first.obj.base.data_ptr() == second.obj.base.data_ptr()  # type: ignore[union-attr]
    kept = bytes(second)
    larger = codec.encode(torch.full((5000,), 2.0), out=buffer)
    assert bytes(second) == kept, "growing must not move or change a payload still held"
    assert torch.equal(decode_payload(larger, shape=(5000,)), torch.full((5000,), 2.0))


def test_buffer_payload_is_usable_where_bytes_are() -> None:
    payload = make_codec("fp16").encode(torch.arange(100.0), out=PayloadBuffer())
    joined = b"".join([payload[:10], payload[10:]])
    assert len(joined) == len(payload) and joined == bytes(payload)


def test_a_released_payloads_memory_is_reused() -> None:
    codec, buffer = make_codec("fp16"), PayloadBuffer()
    first = codec.encode(torch.ones(1000), out=buffer)
    address = first.obj.base.data_ptr()  # type: ignore[union-attr]
    del first
    second = codec.encode(torch.full((1000,), 2.0), out=buffer)
    assert second.obj.base.data_ptr() == address  # type: ignore[union-attr]


@pytest.mark.parametrize(("name", "params"), CODECS)
def test_encoding_into_the_residual_gives_encode_with_feedbacks_bits(
    name: str, params: dict
) -> None:
    params = {**params, "seed": 0} if name == "ecsgd" else params  # same rounding draws
    gen = torch.Generator().manual_seed(3)
    for p in (torch.randn(70_000, generator=gen), torch.randn(40, 300, generator=gen).t()):
        want_payload, want_e = make_codec(name, **params).encode_with_feedback(p, None)
        in_place = p.clone()
        payload = make_codec(name, **params).encode_into_residual(in_place, out=PayloadBuffer())
        assert bytes(payload) == bytes(want_payload)
        assert torch.equal(in_place, want_e.view(p.shape))

"""Truncated, corrupted, foreign and oversized payloads raise PayloadError, never garbage."""

from __future__ import annotations

import struct

import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from skyfed.compression import PayloadError, decode_payload, frame, make_codec, payload_codec

CODECS = [
    ("fp32", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("topk", {"density": 0.01}),
    ("topk", {"density": 0.5, "values": "fp16"}),
    ("topk", {"density": 0.05, "bits": 2}),
    ("topk", {"density": 0.3, "bits": 3}),
    ("topk", {"density": 0.05, "bits": 4}),
    ("ecsgd", {"bits": 1}),
    ("ecsgd", {"bits": 2}),
    ("ecsgd", {"bits": 4}),
]

SHAPE = (7, 300)


def _payload(name: str, params: dict) -> bytes:
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    return make_codec(name, **params).encode(x)


def _decodes_or_refuses(payload: bytes) -> None:
    """Either a PayloadError, or a finite tensor of exactly the frame's shape."""
    try:
        y = decode_payload(payload, shape=SHAPE)
    except PayloadError:
        return
    f = frame.unpack(payload, max_body=1 << 30)
    assert tuple(y.shape) == f.shape
    assert torch.isfinite(y).all() or payload_codec(payload) in ("fp32", "fp16", "bf16")


@pytest.mark.parametrize(("name", "params"), CODECS)
def test_every_truncation_is_refused(name: str, params: dict) -> None:
    payload = _payload(name, params)
    for cut in range(0, len(payload), max(1, len(payload) // 200)):
        with pytest.raises(PayloadError):
            decode_payload(payload[:cut], shape=SHAPE)


@pytest.mark.parametrize(("name", "params"), CODECS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_bit_flips_are_refused_or_decode_to_the_frame_shape(
    name: str, params: dict, data: st.DataObject
) -> None:
    payload = bytearray(_payload(name, params))
    head = min(len(payload), 64)
    position = data.draw(st.integers(0, head - 1) | st.integers(0, len(payload) - 1))
    payload[position] ^= 1 << data.draw(st.integers(0, 7))
    _decodes_or_refuses(bytes(payload))


@settings(max_examples=60, deadline=None)
@given(junk=st.binary(max_size=200))
def test_foreign_bytes_are_refused(junk: bytes) -> None:
    with pytest.raises(PayloadError):
        decode_payload(junk, shape=SHAPE)
    with pytest.raises(PayloadError):
        decode_payload(bytes((frame.VERSION,)) + junk, shape=SHAPE)


def test_unknown_codec_id_is_refused() -> None:
    payload = bytearray(_payload("fp16", {}))
    payload[1] = 200  # the codec id follows the version byte
    with pytest.raises(PayloadError, match="unknown codec"):
        decode_payload(bytes(payload), shape=SHAPE)


@pytest.mark.parametrize(("name", "params"), CODECS)
def test_payload_given_to_the_wrong_codec_is_refused(name: str, params: dict) -> None:
    payload = _payload(name, params)
    for other in ("fp32", "fp16", "topk", "ecsgd"):
        if other != name:
            with pytest.raises(PayloadError):
                make_codec(other).decode(payload, shape=SHAPE)


def _with_shape(payload: bytes, shape: tuple[int, ...]) -> bytes:
    """The same payload with its frame's shape replaced."""
    f = frame.unpack(payload, max_body=0)
    return frame.pack(f.codec, shape, f.params, f.body)


@pytest.mark.parametrize(("name", "params"), CODECS)
@pytest.mark.parametrize("shape", [(1 << 33,), (1 << 20, 1 << 20), (2**63,), (0,)])
def test_claimed_shape_that_the_body_cannot_hold_is_refused(
    name: str, params: dict, shape: tuple[int, ...]
) -> None:
    with pytest.raises(PayloadError):
        decode_payload(_with_shape(_payload(name, params), shape), shape=shape)


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16"])
def test_dense_payload_claiming_one_more_element_is_refused(name: str) -> None:
    with pytest.raises(PayloadError):
        decode_payload(_with_shape(_payload(name, {}), (7, 301)), shape=(7, 301))


def test_sparse_payload_claiming_a_huge_tensor_is_refused_before_allocating() -> None:
    payload = make_codec("topk", density=1e-6, dense_below=0).encode(torch.randn(10))  # k = 1
    with pytest.raises(PayloadError, match="keeps 1 of"):
        decode_payload(_with_shape(payload, (1 << 30,)), shape=(1 << 30,))


def test_zstd_bomb_is_refused_before_allocating() -> None:
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))
    head = frame.header(0, (4,), struct.pack("<f", 1.0), flags=frame.FLAG_ZSTD)
    with pytest.raises(PayloadError):
        decode_payload(head + bomb, shape=(4,))
    with pytest.raises(PayloadError):
        frame.decompress(bomb, 1 << 20)


def test_decoding_into_a_tensor_of_another_shape_is_refused() -> None:
    payload = _payload("topk", {"density": 0.01})
    with pytest.raises(PayloadError, match="expected"):
        decode_payload(payload, out=torch.empty(7, 299))

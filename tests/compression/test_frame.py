"""The compact frame header: every shape and parameter length round-trips, the body starts
aligned, one encoding per header, and a version-1 frame is named, not misread."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skyfed.compression import PayloadError, decode_payload, frame, make_codec

shapes = st.lists(st.integers(0, 1 << 31), min_size=0, max_size=frame.MAX_NDIM).filter(
    lambda dims: math.prod(dims) <= frame.MAX_NUMEL
)


@settings(max_examples=200, deadline=None)
@given(shape=shapes, params=st.binary(max_size=300), body=st.binary(max_size=64))
def test_every_header_round_trips_with_its_body_aligned(
    shape: list[int], params: bytes, body: bytes
) -> None:
    head = frame.header(7, tuple(shape), params)
    assert len(head) % frame.ALIGN == 0
    f = frame.unpack(head + body, max_body=0, shape=tuple(shape))
    assert (f.codec, f.shape, f.params, bytes(f.body)) == (7, tuple(shape), params, body)


@settings(max_examples=200, deadline=None)
@given(value=st.integers(0, 2**63 - 1))
def test_varints_round_trip_at_their_shortest(value: int) -> None:
    out = bytearray()
    frame.put_varint(out, value)
    assert len(out) == max(1, -(-value.bit_length() // 7))
    assert frame.get_varint(bytes(out), 0, "test") == (value, len(out))


def test_an_overlong_varint_is_refused() -> None:
    # 5 as two bytes (0x85 0x00): the same value in another form.
    forged = bytes((frame.VERSION, 0, 1 << 4, 0x85, 0x00, 0, 0, 0))
    with pytest.raises(PayloadError, match="overlong varint"):
        frame.unpack(forged, max_body=0)


def test_padding_that_is_not_zeros_is_refused() -> None:
    head = bytearray(frame.header(0, (4,), b"\1"))
    head[-1] = 1
    with pytest.raises(PayloadError, match="padding"):
        frame.unpack(bytes(head), max_body=0)


def test_a_header_of_a_small_2d_tensor_takes_a_third_of_version_1s() -> None:
    payload = make_codec("ecsgd", bits=1, block=128).encode(torch.randn(128, 32))
    f = frame.unpack(payload, max_body=0)
    # version, codec, flags and ndim 3; dims 2 + 1; params length 1; bits 1, block 2: 10,
    # padded to 12, where version 1 took 28 before 8 bytes of parameters.
    assert len(payload) - len(f.body) == 12


def test_a_version_1_frame_is_refused_naming_the_upgrade() -> None:
    # An FP32 frame of one element as version 1 made it: "SKFD", version 1, codec 0.
    v1 = b"SKFD" + bytes((1, 0, 0, 1)) + (1).to_bytes(8, "little") + (4).to_bytes(4, "little")
    v1 += bytes(4) + bytes(4)  # scale, one float
    with pytest.raises(PayloadError, match="version-1 frame .*upgrade the peer"):
        decode_payload(v1, shape=(1,))

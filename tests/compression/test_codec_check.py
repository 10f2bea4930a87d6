"""A receiver's check of a payload: refused where decoding is, its squared norm as decoded."""

from __future__ import annotations

import math

import pytest
import torch

from skyfed.compression import PayloadError, check_payload, decode_payload, make_codec

from .test_codec_roundtrip import CODECS


@pytest.mark.parametrize(("name", "params"), CODECS)
@pytest.mark.parametrize("numel", [3000, 200_000])
def test_the_checked_squares_are_the_decoded_tensors(name: str, params: dict, numel: int) -> None:
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0)) * 1e-2
    payload = bytes(make_codec(name, **params).encode(x))
    decoded = decode_payload(payload, shape=x.shape)
    want = float(torch.linalg.vector_norm(decoded, dtype=torch.float64)) ** 2
    assert math.isclose(check_payload(payload, out=torch.empty(numel)), want, rel_tol=1e-5)
    assert math.isclose(check_payload(payload, shape=x.shape), want, rel_tol=1e-5)


@pytest.mark.parametrize(("name", "params"), CODECS)
def test_a_payload_of_another_shape_is_refused(name: str, params: dict) -> None:
    payload = bytes(make_codec(name, **params).encode(torch.randn(3000)))
    with pytest.raises(PayloadError, match="shape"):
        check_payload(payload, shape=(3001,))


def test_a_payload_holding_nan_is_refused() -> None:
    payload = bytes(make_codec("fp16").encode(torch.tensor([1.0, float("nan"), 2.0])))
    with pytest.raises(PayloadError, match="NaN"):
        check_payload(payload, shape=(3,))


def test_the_expected_shape_is_required() -> None:
    payload = bytes(make_codec("fp16").encode(torch.ones(3)))
    with pytest.raises(ValueError, match="expected shape"):
        check_payload(payload)

"""A frame is checked against the shape the receiver expects before anything of the size
it claims is allocated: a kilobyte cannot cost gigabytes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import zstandard

from skyfed.compression import PayloadError, decode_add_payload, decode_payload, frame, make_codec
from skyfed.compression.topk import Params as TopkParams

# Every codec; Top-k keeping 540 of 20,000 elements, as delta varints: on its own terms
# (a density floor of 1e-6) such a frame may claim up to 5.4e8 elements.
TOPK_540 = {"density": 0.027, "dense_below": 0}
CODECS = [
    ("fp32", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("topk", TOPK_540),
    ("topk", {**TOPK_540, "values": "fp16"}),
    ("topk", {"density": 1.0, "dense_below": 0}),  # bitmap indices
    ("ecsgd", {"bits": 1}),
    ("ecsgd", {"bits": 2}),
    ("ecsgd", {"bits": 4}),
]
SMALL = (20_000,)
HUGE = (1 << 29,)  # 2 GiB of float32


def _with_shape(payload: bytes, shape: tuple[int, ...]) -> bytes:
    """The same payload with its frame's shape replaced."""
    f = frame.unpack(payload, max_body=0)
    return frame.pack(f.codec, shape, f.params, f.body)


def _peak_rss_growth(fn) -> int:
    """Bytes the process's peak resident set grew by while ``fn`` ran (Linux's VmHWM,
    reset first through ``/proc/self/clear_refs``)."""

    def hwm() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc/self/status")

    Path("/proc/self/clear_refs").write_text("5")
    before = hwm()
    fn()
    return hwm() - before


@pytest.mark.parametrize(("name", "params"), CODECS)
def test_a_small_frame_claiming_two_gib_is_refused_without_allocating_them(
    name: str, params: dict
) -> None:
    payload = _with_shape(make_codec(name, **params).encode(torch.randn(SMALL)), HUGE)
    claimed_bytes = 4 * HUGE[0]

    def refuse_every_way() -> None:
        with pytest.raises(PayloadError, match="expected"):
            decode_payload(payload, shape=SMALL)
        with pytest.raises(PayloadError, match="expected"):
            decode_payload(payload, out=torch.empty(SMALL))
        with pytest.raises(PayloadError, match="expected"):
            decode_add_payload(payload, torch.zeros(SMALL))

    assert _peak_rss_growth(refuse_every_way) < claimed_bytes / 100


def test_a_topk_frame_of_a_kilobyte_claiming_2_29_elements_is_refused_by_its_receiver() -> None:
    # The outside test's frame: 1,118 bytes keeping ~540 elements, enough to claim 2**29
    # on Top-k's own density floor; today's decoder zero-filled 2 GiB for it.
    codec = make_codec("topk", density=1.0, dense_below=0)
    payload = _with_shape(codec.encode(torch.randn(540)), HUGE)
    assert len(payload) < 1200
    growth = _peak_rss_growth(
        lambda: pytest.raises(PayloadError, codec.decode, payload, shape=(540,))
    )
    assert growth < 4 * HUGE[0] / 100


@pytest.mark.parametrize(("name", "params"), CODECS)
def test_a_frame_of_another_shape_is_refused_on_every_decode_path(name: str, params: dict) -> None:
    codec = make_codec(name, **params)
    payload = codec.encode(torch.randn(6, 100))
    for wrong in [(600,), (6, 101), (100, 6), ()]:
        with pytest.raises(PayloadError, match="expected"):
            codec.decode(payload, shape=wrong)
        with pytest.raises(PayloadError, match="expected"):
            codec.decode_add(payload, torch.zeros(wrong))
    assert codec.decode(payload, shape=(6, 100)).shape == (6, 100)


def test_a_topk_index_section_inflating_past_its_header_is_refused_before_allocating() -> None:
    payload = make_codec("topk", **TOPK_540).encode(torch.randn(SMALL))
    f = frame.unpack(payload, max_body=0)
    p = TopkParams.unpack(f.params)
    bomb = zstandard.ZstdCompressor().compress(b"\1" * (64 << 20))  # 64 MiB from ~2 KB
    most = (SMALL[0] + 7) // 8 if p.index_kind else 5 * p.k  # the most the header allows
    params = dataclasses.replace(p, zstd=1, raw_len=most).pack()
    forged = frame.pack(f.codec, SMALL, params, f.body[: p.k], bomb)

    def refuse() -> None:
        with pytest.raises(PayloadError, match="zstd body claims"):
            decode_payload(forged, shape=SMALL)

    assert _peak_rss_growth(refuse) < (64 << 20) / 10


def test_decoding_without_an_expected_shape_is_deprecated() -> None:
    payload = make_codec("fp16").encode(torch.ones(3))
    with pytest.warns(DeprecationWarning, match="shape"):
        decode_payload(payload)


def test_out_and_shape_must_agree() -> None:
    payload = make_codec("fp16").encode(torch.ones(3))
    with pytest.raises(ValueError, match="disagrees"):
        decode_payload(payload, out=torch.empty(3), shape=(4,))
    with pytest.raises(ValueError, match="float32"):
        decode_payload(payload, out=torch.empty(3, dtype=torch.float64))


def test_a_dense_frame_one_element_longer_than_its_body_is_refused() -> None:
    payload = make_codec("fp16").encode(torch.ones(7, 300))
    with pytest.raises(PayloadError, match="needs"):
        decode_payload(_with_shape(payload, (7, 301)), shape=(7, 301))

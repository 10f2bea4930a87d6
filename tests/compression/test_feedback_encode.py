"""Error-feedback encoding in place: the textbook rule's payloads and residuals, bit for bit."""

from __future__ import annotations

import weakref

import pytest
import torch

from skyfed.compression import codec_names, decode_add_payload, make_codec
from skyfed.compression.feedback import ErrorFeedback, release_share
from skyfed.proto.chunks import cut
from skyfed.proto.serde import chunk_from_proto, chunk_to_proto
from skyfed.wire import Payload

SHAPES = {"w": (300, 40), "b": (300,), "tiny": (3,)}


def textbook(
    residuals: dict[str, torch.Tensor], codec, tensors: dict[str, torch.Tensor]
) -> dict[str, bytes]:
    """``p = g + e; c = C(p); e = p - D(c)`` with fresh tensors for everything, the
    residual's release bounded to ``|g|`` for a codec that sends all of its input."""
    pending, held = {}, {}
    for key, g in tensors.items():
        e = residuals.get(key)
        share = None if e is None or not codec.capabilities.sends_all else release_share(g, e)
        if e is None:
            pending[key], held[key] = g.clone(), None
        elif share is None:
            pending[key], held[key] = g + e, None
        else:
            pending[key], held[key] = g + e * share, e * (1.0 - share)
    out = {}
    for key, each in codec.plan(pending).items():
        payload, residual = each.encode_with_feedback(pending[key], None)
        residuals[key] = residual if held[key] is None else residual + held[key]
        out[key] = payload
    return out


@pytest.mark.parametrize("name", codec_names())
def test_in_place_encoding_gives_the_textbook_rules_payloads_and_residuals(name):
    gen = torch.Generator().manual_seed(1)
    ours, theirs = ErrorFeedback(), ErrorFeedback()
    # A residual larger than the update first: FP16's bounded release holds part of it.
    for fb in (ours, theirs):
        fb.residuals["w"] = torch.full(SHAPES["w"], 3.0)
    for round_ in range(4):
        g = {k: torch.randn(s, generator=gen) * (1 + round_) for k, s in SHAPES.items()}
        expected = textbook(theirs.residuals, make_codec(name, seed=[round_]), g)
        got = dict(ours.encode(make_codec(name, seed=[round_]), g.items()))
        assert list(got) == list(expected)
        for key, payload in expected.items():
            assert bytes(got[key]) == bytes(payload), (round_, key)
            assert torch.equal(ours.residuals[key], theirs.residuals[key]), (round_, key)


def test_the_inputs_are_only_read():
    fb = ErrorFeedback()
    g = {"w": torch.randn(300, 40)}
    before = g["w"].clone()
    for _ in range(2):
        list(fb.encode(make_codec("fp16"), g.items()))
        list(fb.encode(make_codec("topk", density=0.1), g.items()))
    assert torch.equal(g["w"], before)


@pytest.mark.parametrize("name", codec_names())
def test_borrowed_inputs_from_one_buffer_give_the_same_bits(name):
    gen = torch.Generator().manual_seed(4)
    g = {k: torch.randn(s, generator=gen) for k, s in SHAPES.items()}
    plain, borrowed = ErrorFeedback(), ErrorFeedback()
    buffer = torch.empty(max(t.numel() for t in g.values()))

    def lent():
        for key, t in g.items():
            yield key, buffer[: t.numel()].view(t.shape).copy_(t)

    for round_ in range(2):
        want = dict(plain.encode(make_codec(name, seed=[round_]), g.items()))
        got = dict(borrowed.encode(make_codec(name, seed=[round_]), lent(), borrowed=True))
        assert all(bytes(got[k]) == bytes(want[k]) for k in g)
        assert all(torch.equal(borrowed.residuals[k], plain.residuals[k]) for k in g)


def test_a_payload_still_held_keeps_its_bytes_and_a_released_ones_memory_goes():
    fb, g = ErrorFeedback(), {"w": torch.randn(300, 40)}
    for name in ("fp16", "topk", "ecsgd"):
        codec = make_codec(name, seed=[0])
        list(fb.encode(codec, g.items()))  # a residual from the round before
        held = dict(fb.encode(codec, g.items()))["w"]  # an unacknowledged upload
        kept = bytes(held)
        again = dict(fb.encode(codec, g.items()))["w"]
        assert bytes(held) == kept, name
        memory = weakref.ref(again.obj.base)
        del held, again  # acknowledged: nothing holds the last payload, nor its memory
        assert memory() is None, name


def test_in_place_payloads_cut_into_chunks_protobuf_takes():
    fb = ErrorFeedback()
    data = dict(fb.encode(make_codec("fp16"), {"w": torch.randn(300, 40)}.items()))["w"]
    payload = Payload(0, None, "fp16", data)
    chunks = [
        chunk_from_proto(chunk_to_proto(c))
        for c in cut(payload, kind=0, round=0, first_seq=0, max_chunk_bytes=4096)
    ]
    assert b"".join(c.data for c in chunks) == bytes(data)


SENDER_CODECS = [(name, {}) for name in codec_names()] + [
    ("topk", {"values": "fp16"}),
    ("topk", {"bits": 3}),
    ("topk", {"density": 0.3}),
]


@pytest.mark.parametrize(("name", "params"), SENDER_CODECS)
def test_the_senders_own_apply_is_the_decode_of_its_payloads(name, params):
    """``applied_to``: each tensor takes ``alpha * D(c)`` from what the encoder holds (Top-k:
    its indices and decoded values), bit for bit ``decode_add`` of the payload; the
    payloads and residuals are those without it. Shard views and float64 included."""
    gen = torch.Generator().manual_seed(9)
    g = {k: torch.randn(s, generator=gen) for k, s in SHAPES.items()}
    plain, applying = ErrorFeedback(), ErrorFeedback()
    big = torch.randn(600, 40, generator=gen)
    weights = {"w": big[::2], "b": torch.randn(300, dtype=torch.float64), "tiny": torch.zeros(3)}
    expected = {k: w.clone() for k, w in weights.items()}
    for round_ in range(3):
        want = dict(plain.encode(make_codec(name, seed=[round_], **params), g.items()))
        for key, payload in want.items():
            decode_add_payload(payload, expected[key], -1.0)
        got = dict(
            applying.encode(
                make_codec(name, seed=[round_], **params),
                g.items(),
                applied_to=weights,
                alpha=-1.0,
            )
        )
        for key in g:
            assert bytes(got[key]) == bytes(want[key]), (round_, key)
            assert torch.equal(applying.residuals[key], plain.residuals[key]), (round_, key)
            assert torch.equal(weights[key], expected[key]), (round_, key)


@pytest.mark.parametrize("params", [{}, {"values": "fp16"}, {"bits": 2}, {"density": 0.3}])
def test_a_sum_left_to_top_ks_pass_gives_the_same_bits_as_one_made_first(params):
    """Top-k sums ``p = e + g`` in its selection's pass (inputs the caller keeps); a
    borrowed input is summed first. Same payloads and residuals, the plan's threshold
    over two large tensors included."""
    gen = torch.Generator().manual_seed(12)
    shapes = {"a": (400, 300), "b": (200, 300), "bias": (300,)}
    fused, summed = ErrorFeedback(), ErrorFeedback()
    buffer = torch.empty(400 * 300)
    for round_ in range(4):
        g = {k: torch.randn(s, generator=gen) * (1 + (k == "a")) for k, s in shapes.items()}
        lent = ((k, buffer[: t.numel()].view(t.shape).copy_(t)) for k, t in g.items())
        want = dict(summed.encode(make_codec("topk", **params), lent, borrowed=True))
        got = dict(fused.encode(make_codec("topk", **params), g.items()))
        for key in shapes:
            assert bytes(got[key]) == bytes(want[key]), (round_, key)
            assert torch.equal(fused.residuals[key], summed.residuals[key]), (round_, key)

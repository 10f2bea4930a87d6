"""The uplink streams: each payload leaves as soon as it is encoded, bit for bit what the
whole-contribution encode gives, and each delta slice is let go once it is taken."""

from __future__ import annotations

import pytest
import torch

from skyfed.agent.uplink import Uplink
from skyfed.compression import make_codec
from skyfed.fingerprint import TensorInfo

SPEC = [TensorInfo(f"t{i}", (64, 33), "float32") for i in range(4)]


def _deltas(seed: int) -> list[torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(t.shape, generator=gen) for t in SPEC]


@pytest.mark.parametrize("codec", ["fp16", "topk", "ecsgd"])
def test_a_streamed_contribution_is_the_whole_encode_payload_for_payload(codec):
    whole, streamed = Uplink(SPEC, [None] * 4), Uplink(SPEC, [None] * 4)
    for round_ in range(3):  # later rounds carry residuals
        a = whole.encode(round_, make_codec(codec, seed=[round_]), _deltas(round_))
        delta = _deltas(round_)
        b = []
        for payload in streamed.stream(round_, make_codec(codec, seed=[round_]), delta):
            b.append(payload)
        assert [(p.tensor, bytes(p.data)) for p in a] == [(p.tensor, bytes(p.data)) for p in b]
        assert delta == [None] * 4  # every slice let go
        for key in whole.keys:
            assert torch.equal(whole.feedback.residuals[key], streamed.feedback.residuals[key])


def test_the_first_payload_leaves_before_the_last_tensor_is_taken():
    delta = _deltas(0)
    payloads = Uplink(SPEC, [None] * 4).stream(0, make_codec("fp16"), delta)
    first = next(payloads)
    assert first.tensor == 0 and delta[0] is None and delta[-1] is not None
    assert len(list(payloads)) == 3

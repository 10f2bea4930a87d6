"""The downlink's encoder, without gRPC: the agents' error feedback, applied exactly."""

from __future__ import annotations

import torch

from skyfed.compression import decode_payload, make_codec, policy, rounding_seed
from skyfed.compression.feedback import ErrorFeedback
from skyfed.compression.policy import PolicyConfig
from skyfed.coordinator.downlink import SENDER, Downlink, Update
from skyfed.coordinator.links import CodecRun
from skyfed.fingerprint import TensorInfo

SPEC = [TensorInfo("w", (64, 32), "float32"), TensorInfo("b", (64,), "float32")]
SEED = 7


def from_list(updates: list[torch.Tensor]) -> Update:
    return lambda i, out: out.copy_(updates[i])


def updates(round_: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(round_)
    return [torch.randn(t.shape, generator=gen) for t in SPEC]


def test_downlink_error_feedback_equals_the_agents_bit_for_bit():
    policy = PolicyConfig()
    downlink = Downlink(SPEC, policy, SEED)
    weights = [torch.zeros(t.shape) for t in SPEC]
    theirs, expected = ErrorFeedback(), [torch.zeros(t.shape) for t in SPEC]
    for round_, name in enumerate(["topk", "topk", "ecsgd", "fp16"]):
        payloads = list(downlink.encode(weights, from_list(updates(round_)), name, 3, round_))
        params = policy.codec_params(name, round_ - downlink.run.since)
        seed = rounding_seed(SEED, SENDER, round_)
        codec = make_codec(name, seed=seed, **params).for_downlink(3)
        sent = dict(
            theirs.encode(codec, [(t.name, u) for t, u in zip(SPEC, updates(round_), strict=True)])
        )
        for i, t in enumerate(SPEC):
            assert payloads[i].data == sent[t.name]
            assert torch.equal(downlink.feedback.residuals[t.name], theirs.residuals[t.name])
            expected[i] -= decode_payload(sent[t.name], shape=t.shape)
    for got, want in zip(weights, expected, strict=True):  # what agents decode, exactly
        assert torch.equal(got, want)


def test_a_lossless_broadcast_that_releases_everything_holds_nothing():
    downlink = Downlink(SPEC, PolicyConfig(), SEED)
    weights = [torch.zeros(t.shape) for t in SPEC]
    list(downlink.encode(weights, from_list(updates(0)), "topk", 1, 0))
    assert downlink.residual_list() is not None
    for round_ in range(1, 40):  # FP32 releases at most |update| of the backlog per round
        list(downlink.encode(weights, from_list(updates(round_)), "fp32", 1, round_))
        if downlink.residual_list() is None:
            break
    assert downlink.residual_list() is None
    assert downlink.run == CodecRun("fp32", 1)


def test_residuals_survive_a_checkpoint_round_trip():
    downlink = Downlink(SPEC, PolicyConfig(), SEED)
    list(downlink.encode([torch.zeros(t.shape) for t in SPEC], from_list(updates(0)), "topk", 1, 0))
    saved = downlink.residual_list()
    again = Downlink(SPEC, PolicyConfig(), SEED)
    again.load_residual_list(saved)
    assert again.feedback.residuals.keys() == downlink.feedback.residuals.keys()
    for name, r in downlink.feedback.residuals.items():
        assert torch.equal(again.feedback.residuals[name], r)


def test_downlink_of_long_phase_members_sends_ecsgd_in_the_long_phase_blocks(monkeypatch):
    """The broadcast follows the long-phase rule on the fewest local steps of its members
    (its block set to 128 here, so the payloads' sizes show it: the rule's own 1024 is
    the codec's default)."""
    monkeypatch.setattr(policy, "LONG_PHASE_ECSGD_BLOCK", 128)
    blocks = {}
    for local_steps in (0, 128):
        downlink = Downlink(SPEC, PolicyConfig(), SEED)
        weights = [torch.zeros(t.shape) for t in SPEC]
        payloads = list(downlink.encode(weights, from_list(updates(0)), "ecsgd", 2, 0, local_steps))
        blocks[local_steps] = sum(len(p.data) for p in payloads)
    # The codes are as long either way (a ragged last block travels at its own length);
    # the 2048-element weight takes 16 scales in blocks of 128 against 2 in 1024.
    assert blocks[128] - blocks[0] == (16 - 2) * 4

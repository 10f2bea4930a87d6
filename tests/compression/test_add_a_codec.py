"""A codec added as docs/add-a-codec.md says (a class with ``encode``, ``decode`` and its
``Capabilities``, one registration) runs every path of the product: an agent's uplink
through error feedback, the coordinator's check and mean (in memory and staged on disk),
its downlink, the policy and the run report; and the suite's per-codec contracts hold."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

from skyfed.agent.momentum import MomentumCorrection
from skyfed.agent.uplink import Uplink
from skyfed.compression import (
    Capabilities,
    Codec,
    PayloadError,
    decode_add_payload,
    decode_payload,
    frame,
    make_codec,
    register,
    registry,
)
from skyfed.compression.base import expected_shape, output_tensor
from skyfed.compression.frame import PayloadBuffer
from skyfed.compression.monitor import LinkStats
from skyfed.compression.policy import PolicyConfig, PolicyState, heaviest, step
from skyfed.coordinator.aggregate import RoundAggregate
from skyfed.coordinator.downlink import Downlink
from skyfed.fingerprint import TensorInfo
from skyfed.report.plots import codec_style
from tests.compression import (
    test_codec_check,
    test_codec_decode_add,
    test_codec_expected_shape,
    test_codec_malformed,
    test_codec_roundtrip,
    test_feedback_encode,
    test_payload_buffer,
)
from tests.coordinator import test_aggregate, test_spill
from tests.coordinator.test_downlink import from_list

_SCALE = struct.Struct("<f")


class Int8(Codec):
    """INT8 with one scale per tensor: ``c = round(x / s)``, ``s = max|x| / 127``;
    ``D(c) = s c``. Every element travels (error feedback releases its residual bounded)."""

    name = "int8"
    wire_id = 200
    capabilities = Capabilities(heaviness=25, sends_all=True, color="#009E73")

    def encode(self, x: torch.Tensor, out: PayloadBuffer | None = None) -> bytes:
        flat = x.detach().to(torch.float32).reshape(-1)
        peak = float(flat.abs().max()) if flat.numel() else 0.0
        if not math.isfinite(peak):
            raise ValueError("int8 input holds inf or NaN")
        scale = float(np.float32(peak / 127.0)) or 1.0
        q = torch.round(flat / scale).clamp_(-127, 127).to(torch.int8)
        return frame.pack(self.wire_id, tuple(x.shape), _SCALE.pack(scale), q.numpy(), out=out)

    def decode(
        self,
        payload: bytes,
        out: torch.Tensor | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        f = frame.unpack(payload, max_body=0, shape=expected_shape(out, shape))
        if f.codec != self.wire_id or len(f.params) != _SCALE.size or len(f.body) != f.numel:
            raise PayloadError(f"not an int8 payload of shape {f.shape}")
        (scale,) = _SCALE.unpack(f.params)
        if not (math.isfinite(scale) and scale > 0):
            raise PayloadError(f"int8 payload has scale {scale}")
        result = output_tensor(f.shape, out)
        q = torch.from_numpy(np.frombuffer(f.body, dtype=np.int8))
        result.view(-1).copy_(q).mul_(scale)
        return result


@pytest.fixture
def int8(monkeypatch):
    """The codec registered for one test: the registry as it was afterwards."""
    monkeypatch.setattr(registry, "_CODECS", dict(registry._CODECS))
    monkeypatch.setattr(registry, "_DECODERS", dict(registry._DECODERS))
    register(Int8)
    return "int8"


SPEC = [TensorInfo("w", (64, 48), "float32"), TensorInfo("b", (64,), "float32")]


def test_a_round_of_it_runs_the_uplink_the_aggregate_and_the_downlink(int8):
    """Two sites' uplinks through their error feedback, checked and averaged by the
    coordinator, the mean broadcast through its own error feedback: every site's weights
    take what the coordinator's take, bit for bit, and the mean is the decoded payloads'."""
    gen = torch.Generator().manual_seed(0)
    sites = {"aws": (2, Uplink(SPEC, [None, None])), "gcp": (3, Uplink(SPEC, [None, None]))}
    downlink = Downlink(SPEC, PolicyConfig(), seed=7)
    ours = [torch.zeros(t.shape) for t in SPEC]
    theirs = {key: [torch.zeros(t.shape) for t in SPEC] for key in sites}
    for round_ in range(3):
        aggregate, expected = RoundAggregate(SPEC), [torch.zeros(t.shape) for t in SPEC]
        for key, (samples, uplink) in sites.items():
            delta = [torch.randn(t.shape, generator=gen) for t in SPEC]
            contribution = aggregate.begin(samples, key)
            for payload in uplink.stream(round_, make_codec(int8), list(delta)):
                assert payload.codec == int8
                contribution.stage(contribution.check(payload))
                decoded = decode_payload(payload.data, shape=SPEC[payload.tensor].shape)
                expected[payload.tensor].add_(decoded, alpha=samples)
            contribution.commit()
            uplink.acked(round_)
        mean = aggregate.mean()
        assert all(torch.equal(m, e.div_(5)) for m, e in zip(mean, expected, strict=True))
        for payload in downlink.encode(ours, from_list(mean), int8, 2, round_):
            assert payload.codec == int8
            for weights in theirs.values():
                decode_add_payload(payload.data, weights[payload.tensor], -1.0)
        for weights in theirs.values():
            assert all(torch.equal(w, o) for w, o in zip(weights, ours, strict=True))
    assert downlink.residual_list() is not None  # lossy: it holds what it did not send


def test_its_capabilities_place_it_in_the_policy_the_downlink_and_the_report(int8):
    assert heaviest(["fp16", int8, "bf16"]) == int8 == Downlink.codec_for([int8, "fp32"])
    assert heaviest([int8, "topk"]) == "topk"
    far = PolicyConfig(medium=int8, heavier_after_windows=1)
    assert step(PolicyState("fp16"), LinkStats(rtt_ms=120.0, loss_pct=0.0), far).codec == int8
    assert codec_style(int8) == (25, "#009E73")
    assert sorted(["topk", int8, "fp16", "unknown"], key=codec_style) == [
        "fp16",
        int8,
        "topk",
        "unknown",
    ]
    momentum = MomentumCorrection(lr=0.1, momentum=0.9)
    momentum.step([torch.ones(3)])
    momentum.mask([torch.ones(3)], make_codec(int8))  # dense: the velocity stays
    assert torch.equal(momentum.velocity[0], torch.ones(3))


def test_a_name_or_wire_id_taken_and_a_codec_without_capabilities_are_refused(int8):
    with pytest.raises(ValueError, match="registered already"):
        register(Int8)

    class NoCapabilities(Int8):
        name, wire_id = "bare", 201
        capabilities = None  # type: ignore[assignment]

    with pytest.raises(ValueError, match="declares no Capabilities"):
        register(NoCapabilities)


def test_its_payload_is_refused_where_it_is_not_registered():
    payload = Int8().encode(torch.ones(4))
    with pytest.raises(PayloadError, match="unknown codec id 200"):
        decode_payload(payload, shape=(4,))
    with pytest.raises(ValueError, match="unknown codec 'int8'"):
        make_codec("int8")


CONTRACTS = [
    (test_codec_roundtrip.test_decode_is_deterministic_and_ignores_decoder_parameters, {}),
    (test_codec_malformed.test_every_truncation_is_refused, {}),
    (test_codec_malformed.test_payload_given_to_the_wrong_codec_is_refused, {}),
    (test_codec_expected_shape.test_a_frame_of_another_shape_is_refused_on_every_decode_path, {}),
    (test_codec_check.test_the_checked_squares_are_the_decoded_tensors, {"numel": 200_000}),
    (test_codec_check.test_a_payload_of_another_shape_is_refused, {}),
    (test_codec_decode_add.test_decode_add_equals_adding_a_fresh_decode_bit_for_bit, {}),
    (test_codec_decode_add.test_decode_add_into_a_shard_view_touches_only_the_shard, {}),
    (test_codec_decode_add.test_decode_into_a_reused_buffer_equals_a_fresh_decode, {}),
    (
        test_codec_decode_add.test_feedback_keeps_e_prime_equal_to_p_minus_what_the_receiver_decodes,
        {},
    ),
    (test_codec_decode_add.test_adding_the_checks_parse_is_decode_add_bit_for_bit, {}),
    (test_payload_buffer.test_payload_in_a_buffer_equals_the_bytes_payload, {}),
]


@pytest.mark.parametrize(("contract", "extra"), CONTRACTS, ids=lambda c: getattr(c, "__name__", ""))
def test_the_per_codec_contracts_of_the_codec_tests_hold_for_it(int8, contract, extra):
    """The codec tests' own functions, as their lists of codecs would run them."""
    params = {"dtype": torch.float64} if "dtype" in contract.__code__.co_varnames else {}
    contract(name=int8, params={}, **params, **extra)


@pytest.mark.parametrize("sharding", range(3), ids=["whole", "rows", "columns"])
def test_the_aggregates_and_the_spills_means_are_its_decoded_sums(int8, sharding, tmp_path):
    shards = test_aggregate.SHARDINGS[sharding]
    test_aggregate.test_decoding_into_the_mean_is_bit_for_bit_decode_then_add(int8, shards)
    shards = test_spill.SHARDINGS[sharding]  # its own tensors' shards
    test_spill.test_spilled_uplinks_give_the_mean_bit_for_bit(int8, shards, tmp_path)


def test_error_feedbacks_contracts_hold_for_it(int8, tmp_path):
    test_feedback_encode.test_in_place_encoding_gives_the_textbook_rules_payloads_and_residuals(
        int8
    )
    test_feedback_encode.test_borrowed_inputs_from_one_buffer_give_the_same_bits(int8)
    test_feedback_encode.test_the_senders_own_apply_is_the_decode_of_its_payloads(int8, {})
    test_aggregate.test_a_withdrawn_contribution_leaves_the_sum_exactly_as_without_it(int8)
    test_spill.test_a_payload_past_the_budget_is_put_together_on_disk_as_it_arrives(int8, tmp_path)

"""One agent cannot steer the model: its weight is capped, its update's norm clipped."""

from __future__ import annotations

import math

import torch

from tests.coordinator.test_bad_input import contribution, deltas, expected_weights, join, send

SKIP = ("heartbeat", "chunk", "receipt")


def _norm(tensors: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().square().sum()) for t in tensors))


def test_huge_samples_claim_counts_no_more_than_max_samples(serve, raw_agent):
    running = serve(min_agents=2, max_samples=16)
    aws, gcp = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(aws, "aws", "aws-1"), join(gcp, "gcp", "gcp-1")
    send(aws, *contribution(deltas(1)))
    header, chunks = contribution(deltas(2))
    header.samples = 1 << 24  # the most the wire allows; 16 count
    send(gcp, header, chunks)
    assert gcp.expect("round_end", skip=SKIP).round_end.contributors == 2
    for got, want in zip(running.federation.model.weights, expected_weights(1, 2), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-7)  # equal weights


def test_outsized_update_is_clipped_to_the_recent_median_bound(serve, raw_agent):
    running = serve(min_agents=1, clip_norm_ratio=2.0)
    aws = raw_agent(running.port, "aws-1")
    join(aws, "aws", "aws-1")
    honest = deltas(1)
    for r in range(3):  # warm-up: three accepted norms
        send(aws, *contribution(honest, round=r))
        assert aws.expect("round_end", skip=SKIP).round_end.round == r
    before = [w.clone() for w in running.federation.model.weights]
    attack = [d * 100 for d in deltas(4)]
    send(aws, *contribution(attack, round=3))
    assert aws.expect("round_end", skip=SKIP).round_end.round == 3
    moved = [b - a for a, b in zip(running.federation.model.weights, before, strict=True)]
    assert math.isclose(_norm(moved), 2.0 * _norm(honest), rel_tol=1e-3)
    scale = 2.0 * _norm(honest) / _norm(attack)
    for got, want in zip(moved, attack, strict=True):
        torch.testing.assert_close(got, want * scale, rtol=0, atol=1e-6)

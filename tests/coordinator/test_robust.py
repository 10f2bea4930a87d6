"""One agent cannot steer the model: its weight is capped, its update's norm clipped."""

from __future__ import annotations

import math

import pytest
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


def _moved(before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    return _norm([b - a for a, b in zip(after, before, strict=True)])


def test_a_first_huge_update_on_a_fresh_coordinator_is_clipped(serve, raw_agent):
    """No warm-up lets the first updates through unbounded: with two sites the bound is
    the smaller norm's, so the attacker's 1e30 counts as 4x the honest site's update."""
    running = serve(min_agents=2, quorum=2, clip_norm_ratio=4.0)
    aws, gcp = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(aws, "aws", "aws-1"), join(gcp, "gcp", "gcp-1")
    before = [w.clone() for w in running.federation.model.weights]
    honest, attack = deltas(1), [torch.full_like(d, 1e30) for d in deltas(2)]
    send(aws, *contribution(honest))
    send(gcp, *contribution(attack))
    assert aws.expect("round_end", skip=SKIP).round_end.contributors == 2
    after = running.federation.model.weights
    assert all(bool(torch.isfinite(w).all()) for w in after)
    # the mean of the honest update and the attacker's clipped to 4 x its norm
    assert _moved(before, after) <= (1 + 4.0) / 2 * _norm(honest) * 1.001


def test_one_attacker_of_two_cannot_raise_the_bound_over_many_rounds(serve, raw_agent):
    """The lower median of an even window is an honest norm, never the mean of an honest
    norm and the attacker's own: round after round the attacker counts at 4x at most."""
    running = serve(min_agents=2, quorum=2, clip_norm_ratio=4.0)
    aws, gcp = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(aws, "aws", "aws-1"), join(gcp, "gcp", "gcp-1")
    honest = deltas(1)
    for r in range(12):
        before = [w.clone() for w in running.federation.model.weights]
        send(aws, *contribution(honest, round=r))
        send(gcp, *contribution([d * 1e12 for d in deltas(2)], round=r))
        assert aws.expect("round_end", skip=SKIP).round_end.round == r
        moved = _moved(before, running.federation.model.weights)
        assert moved <= (1 + 4.0) / 2 * _norm(honest) * 1.001, r


def test_a_restarted_coordinator_clips_its_first_round_with_the_window_it_kept(
    serve, raw_agent, tmp_path
):
    """The window is in the checkpoint: after a restart, one huge update alone is clipped
    against the norms of the rounds before (fresh, it would set its own bound)."""
    ckpt = tmp_path / "ckpt"
    first = serve(min_agents=1, clip_norm_ratio=2.0, checkpoint_dir=ckpt)
    aws = raw_agent(first.port, "aws-1")
    join(aws, "aws", "aws-1")
    honest = deltas(1)
    for r in range(3):
        send(aws, *contribution(honest, round=r))
        assert aws.expect("round_end", skip=SKIP).round_end.round == r
    first.federation.stop()
    first.federation.rounds.close_checkpoints()
    second = serve(min_agents=1, clip_norm_ratio=2.0, checkpoint_dir=ckpt)
    assert second.federation.model.norms.state() == pytest.approx([_norm(honest)] * 3)
    gcp = raw_agent(second.port, "gcp-1")
    join(gcp, "gcp", "gcp-1")
    before = [w.clone() for w in second.federation.model.weights]
    send(gcp, *contribution([d * 1e6 for d in deltas(2)], round=3))
    assert gcp.expect("round_end", skip=(*SKIP, "weights_end")).round_end.round == 3
    assert math.isclose(
        _moved(before, second.federation.model.weights), 2.0 * _norm(honest), rel_tol=1e-3
    )

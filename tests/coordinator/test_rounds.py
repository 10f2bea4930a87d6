"""When a round closes: all members, or quorum after the deadline; early and absent members."""

from __future__ import annotations

import queue
import time

import grpc
import pytest
import torch

from .test_bad_input import contribution, deltas, expected_weights, join, model_and_spec, send


def test_contribution_sent_before_round_zero_opens_counts(serve, raw_agent):
    running = serve(min_agents=2)
    early, later = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(early, "aws", "aws-1")
    send(early, *contribution(deltas(1)))
    assert early.expect("receipt").receipt.accepted
    join(later, "gcp", "gcp-1")
    send(later, *contribution(deltas(2)))
    assert early.expect("round_end").round_end.contributors == 2


def test_round_closes_at_the_deadline_once_a_quorum_reported(serve, raw_agent):
    running = serve(min_agents=2, quorum=1, round_deadline_s=0.5)
    fast, idle = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(fast, "aws", "aws-1"), join(idle, "gcp", "gcp-1")
    started = time.monotonic()
    send(fast, *contribution(deltas(1)))
    assert fast.expect("receipt").receipt.accepted
    end = fast.expect("round_end").round_end
    assert end.contributors == 1
    assert time.monotonic() - started >= 0.4


def test_deadline_counts_from_the_first_contribution_not_the_rounds_opening(serve, raw_agent):
    """A local phase longer than the deadline (DiLoCo's hundreds of steps): the first
    contribution must not close the round at once; stragglers get the deadline from it."""
    running = serve(min_agents=2, quorum=1, round_deadline_s=0.5)
    fast, slow = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(fast, "aws", "aws-1"), join(slow, "gcp", "gcp-1")
    time.sleep(1.0)  # both train past the deadline
    send(fast, *contribution(deltas(1)))
    assert fast.expect("receipt").receipt.accepted
    send(slow, *contribution(deltas(2)))
    assert fast.expect("round_end").round_end.contributors == 2


def test_round_waits_past_the_deadline_until_a_quorum_reported(serve, raw_agent):
    running = serve(min_agents=2, quorum=2, round_deadline_s=0.2)
    a, b = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(a, "aws", "aws-1"), join(b, "gcp", "gcp-1")
    send(a, *contribution(deltas(1)))
    assert a.expect("receipt").receipt.accepted
    with pytest.raises(queue.Empty):
        a.expect("round_end", timeout=1.0)
    send(b, *contribution(deltas(2)))
    assert a.expect("round_end").round_end.contributors == 2


def test_disconnected_member_is_not_awaited(serve, raw_agent):
    running = serve(min_agents=2, round_deadline_s=60)
    stays, leaves = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(stays, "aws", "aws-1"), join(leaves, "gcp", "gcp-1")
    send(stays, *contribution(deltas(1)))
    assert stays.expect("receipt").receipt.accepted
    leaves.close()
    assert stays.expect("round_end", timeout=10).round_end.contributors == 1


def test_half_sent_contribution_at_the_deadline_is_refused_and_not_summed(serve, raw_agent):
    running = serve(min_agents=2, quorum=1, round_deadline_s=0.5)
    done, half = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(done, "aws", "aws-1"), join(half, "gcp", "gcp-1")
    header, chunks = contribution(deltas(2))
    send(half, header, chunks[: len(chunks) // 2])
    send(done, *contribution(deltas(1)))
    assert done.expect("receipt").receipt.accepted
    receipt = half.expect("receipt").receipt
    assert (receipt.accepted, receipt.code) == (False, grpc.StatusCode.ABORTED.value[0])
    assert done.expect("round_end").round_end.contributors == 1
    for got, want in zip(running.federation.model.weights, expected_weights(1), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    assert half.expect("round_end").round_end.round == 0
    send(half, None, chunks[len(chunks) // 2 :])  # the rest is discarded, the session goes on
    send(half, *contribution(deltas(2), round=1))
    assert half.expect("receipt").receipt.accepted


def test_restarted_agent_is_not_counted_twice_in_one_round(serve, raw_agent):
    running = serve(min_agents=2)
    first, other = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(first, "aws", "aws-1"), join(other, "gcp", "gcp-1")
    send(first, *contribution(deltas(1)))
    assert first.expect("receipt").receipt.accepted
    again = raw_agent(running.port, "aws-1")  # the same identity, restarted
    join(again, "aws", "aws-1")
    send(again, *contribution(deltas(3)))
    receipt = again.expect("receipt").receipt
    assert (receipt.accepted, receipt.code) == (False, grpc.StatusCode.ALREADY_EXISTS.value[0])
    send(other, *contribution(deltas(2)))
    assert again.expect("round_end").round_end.contributors == 2
    for got, want in zip(running.federation.model.weights, expected_weights(1, 2), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-7)


def test_a_light_broadcast_after_topk_releases_the_backlog_one_update_at_a_time(serve, raw_agent):
    running = serve(codec="topk")
    lossy = raw_agent(running.port, "aws-1")
    assert join(lossy, "aws", "aws-1", codecs=("fp32", "topk")).codec == "topk"
    big = [d * 100 for d in deltas(1)]  # a backlog far larger than the next update
    send(lossy, *contribution(big, round=0))
    assert lossy.expect("receipt").receipt.accepted
    lossy.expect("round_end")
    backlog = [r.clone() for r in running.federation.model.downlink.residual_list()]
    lossy.close()
    plain = raw_agent(running.port, "gcp-1")
    assert join(plain, "gcp", "gcp-1").codec == "fp32"
    plain.expect("weights_end")
    before = [w.clone() for w in running.federation.model.weights]
    send(plain, *contribution(deltas(2), round=1))
    assert plain.expect("receipt").receipt.accepted
    plain.expect("round_end")
    assert running.federation.rounds.history[-1].downlink_codec == "fp32"
    moved = zip(before, running.federation.model.weights, deltas(2), backlog, strict=True)
    bounded = [(w0, w1, d) for w0, w1, d, held in moved if held.norm() > d.norm()]
    assert bounded, "no tensor held more than its update: the test checks nothing"
    for w0, w1, d in bounded:  # at most the update and one update's worth of backlog
        assert (w0 - w1).norm() <= 2.001 * d.norm()
    # Nothing is lost: what moved plus what is still held is both rounds' work.
    residual = running.federation.model.downlink.residual_list()
    weights, _ = model_and_spec()
    for w, w1, b, d, r in zip(
        weights, running.federation.model.weights, big, deltas(2), residual, strict=True
    ):
        torch.testing.assert_close(w - w1 + r, b + d, rtol=0, atol=1e-5)


def test_lossless_broadcast_after_a_lossy_one_sends_what_the_coordinator_held_back(
    serve, raw_agent
):
    running = serve(codec="topk")
    lossy = raw_agent(running.port, "aws-1")
    assert join(lossy, "aws", "aws-1", codecs=("fp32", "topk")).codec == "topk"
    send(lossy, *contribution(deltas(1), round=0))
    assert lossy.expect("receipt").receipt.accepted
    lossy.expect("round_end")
    assert running.federation.rounds.history[-1].downlink_codec == "topk"
    assert any(r.abs().sum() > 0 for r in running.federation.model.downlink.residual_list())
    lossy.close()
    plain = raw_agent(running.port, "gcp-1")
    assert join(plain, "gcp", "gcp-1").codec == "fp32"  # this agent cannot decode topk
    plain.expect("weights_end")  # it joined behind: the current weights follow the welcome
    send(plain, *contribution(deltas(2), round=1))
    assert plain.expect("receipt").receipt.accepted
    plain.expect("round_end")
    assert running.federation.rounds.history[-1].downlink_codec == "fp32"
    # Both rounds' means (one contributor each) reached the weights in full.
    weights, _ = model_and_spec()
    applied = zip(running.federation.model.weights, weights, deltas(1), deltas(2), strict=True)
    for got, w, d1, d2 in applied:
        torch.testing.assert_close(got, w - d1 - d2, rtol=0, atol=1e-6)


def test_quorum_is_a_minimum_even_when_every_member_has_contributed(serve, raw_agent):
    running = serve(min_agents=2, quorum=2, round_deadline_s=0.2)
    aws, leaves = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(aws, "aws", "aws-1"), join(leaves, "gcp", "gcp-1")
    leaves.close()
    send(aws, *contribution(deltas(1)))
    assert aws.expect("receipt").receipt.accepted
    time.sleep(1.0)  # the lone member left has sent and the deadline is long past
    assert running.federation.model.round == 0
    azure = raw_agent(running.port, "azure-1")
    join(azure, "azure", "azure-1")
    send(azure, *contribution(deltas(2)))
    assert (
        azure.expect("round_end", skip=("heartbeat", "chunk", "receipt")).round_end.contributors
        == 2
    )

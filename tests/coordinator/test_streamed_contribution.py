"""A streamed contribution (header count 0, its count last in a ContributionEnd) is
summed as a counted one, refused and discarded up to its end, and its end is checked."""

from __future__ import annotations

import grpc

from skyfed.proto import federation_pb2 as pb
from tests.coordinator.test_bad_input import contribution, deltas, join, send


def streamed(values, round: int = 0) -> tuple[pb.Contribution, list[pb.Chunk], pb.ContributionEnd]:
    header, chunks = contribution(values, round=round)
    header.chunks = 0
    return header, chunks, pb.ContributionEnd(round=round, chunks=len(chunks))


def stream(agent, header, chunks, end) -> None:
    send(agent, header, chunks)
    agent.send(contribution_end=end)


def test_a_streamed_contribution_gives_the_round_a_counted_one_gives(serve, raw_agent):
    digests = []
    for streams in (False, True):
        running = serve(min_agents=2)
        aws, gcp = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
        join(aws, "aws", "aws-1"), join(gcp, "gcp", "gcp-1")
        send(aws, *contribution(deltas(1)))
        if streams:
            stream(gcp, *streamed(deltas(2)))
        else:
            send(gcp, *contribution(deltas(2)))
        assert aws.expect("receipt").receipt.accepted
        assert gcp.expect("receipt").receipt.accepted
        digests.append(gcp.expect("round_end").round_end.weights_digest)
    assert digests[0] == digests[1]


def test_an_end_that_miscounts_the_chunks_is_invalid_argument(serve, raw_agent):
    running = serve(min_agents=2)
    aws = raw_agent(running.port, "aws-1")
    join(aws, "aws", "aws-1")
    header, chunks, end = streamed(deltas(1))
    end.chunks = len(chunks) + 1
    stream(aws, header, chunks, end)
    code, details = aws.ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "ends at" in details


def test_an_end_without_a_streamed_contribution_is_invalid_argument(serve, raw_agent):
    running = serve(min_agents=2)
    aws = raw_agent(running.port, "aws-1")
    join(aws, "aws", "aws-1")
    aws.send(contribution_end=pb.ContributionEnd(round=0, chunks=1))
    code, details = aws.ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "outside a streamed contribution" in details


def test_a_late_streamed_contribution_is_discarded_up_to_its_end_and_the_session_goes_on(
    serve, raw_agent
):
    running = serve(min_agents=2, quorum=1, round_deadline_s=0.3)
    fast, slow = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(fast, "aws", "aws-1"), join(slow, "gcp", "gcp-1")
    send(fast, *contribution(deltas(1)))
    assert slow.expect("round_end").round_end.round == 0
    stream(slow, *streamed(deltas(2), round=0))
    receipt = slow.expect("receipt").receipt
    assert not receipt.accepted and "closed" in receipt.message
    stream(slow, *streamed(deltas(2), round=1))
    assert slow.expect("receipt").receipt.accepted


def test_a_streamed_contribution_the_round_closes_under_is_withdrawn_up_to_its_end(
    serve, raw_agent
):
    running = serve(min_agents=2, quorum=1, round_deadline_s=0.3)
    fast, slow = raw_agent(running.port, "aws-1"), raw_agent(running.port, "gcp-1")
    join(fast, "aws", "aws-1"), join(slow, "gcp", "gcp-1")
    header, chunks, end = streamed(deltas(2), round=0)
    send(slow, header, chunks[:3])  # half-way when the round closes
    send(fast, *contribution(deltas(1)))
    assert fast.expect("receipt").receipt.accepted
    receipt = slow.expect("receipt").receipt
    assert not receipt.accepted and "while this contribution was arriving" in receipt.message
    assert slow.expect("round_end").round_end.contributors == 1
    send(slow, None, chunks[3:])
    slow.send(contribution_end=end)
    stream(slow, *streamed(deltas(2), round=1))
    assert slow.expect("receipt").receipt.accepted

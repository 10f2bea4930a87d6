"""Striping: whatever lane carries what, and whichever lane dies, the receiver sees the
sender's sequence exactly once (``proto/stripes.py``)."""

from __future__ import annotations

import random
import threading
import time
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skyfed.errors import ProtocolError
from skyfed.proto.stripes import UNORDERED, Kind, Merge, Spread

MESSAGES = st.lists(
    st.sampled_from([Kind.CONTROL, Kind.CHUNK, Kind.CHUNK]), min_size=1, max_size=60
)
STEPS = st.lists(
    st.tuples(st.sampled_from(["pull", "deliver", "kill", "open", "ack"]), st.integers(0, 7)),
    max_size=200,
)


def _deliver_all(spread: Spread, lanes: dict, wires: dict, merge: Merge) -> None:
    """Pull and deliver on every live lane, lane by lane, until nothing moves."""
    moved = True
    while moved:
        moved = False
        for i, lane in list(lanes.items()):
            taken = lane.poll()
            if taken is not None:
                wires[i].append(taken)
                moved = True
        for wire in wires.values():
            while wire:
                position, item = wire.popleft()
                merge.add(position, item, 1)
                moved = True
        spread.acked(merge.received)


@settings(max_examples=300, deadline=None)
@given(kinds=MESSAGES, streams=st.integers(1, 6), steps=STEPS, data=st.data())
def test_striping_reassembles_exactly_over_orders_stream_counts_and_deaths(
    kinds, streams, steps, data
):
    """Any interleaving of pulls and deliveries across N lanes, secondary lanes dying with
    part of what they carried lost and new ones opening: the receiver gets every message
    once, in the order it was put."""
    spread: Spread[str] = Spread()
    out: list[str] = []
    merge: Merge[str] = Merge(out.append, max_held_bytes=1 << 20)
    sent = [f"{kind.value}-{i}" for i, kind in enumerate(kinds)]
    for name, kind in zip(sent, kinds, strict=True):
        spread.put(name, kind)
    lanes = {0: spread.lane(primary=True)}
    lanes.update({i: spread.lane() for i in range(1, streams)})
    wires = {i: deque() for i in lanes}  # what each connection holds in flight, in order
    for action, n in steps:
        live = sorted(lanes)
        i = live[n % len(live)]
        if action == "pull":
            taken = lanes[i].poll()
            if taken is not None:
                wires[i].append(taken)
        elif action == "deliver" and wires[i]:
            position, item = wires[i].popleft()
            merge.add(position, item, 1)
        elif action == "kill" and i != 0:  # the primary's death ends the session instead
            kept = data.draw(st.integers(0, len(wires[i])))
            for _ in range(kept):  # these made it across before the connection died
                position, item = wires[i].popleft()
                merge.add(position, item, 1)
            lanes.pop(i).end()
            wires.pop(i)
        elif action == "open" and len(lanes) < 8:
            lane = spread.lane()
            lanes[lane.index], wires[lane.index] = lane, deque()
        elif action == "ack":
            spread.acked(merge.received)
    _deliver_all(spread, lanes, wires, merge)
    assert out == sent
    assert merge.received == len(sent)


def test_control_messages_travel_only_on_the_primary_lane():
    spread: Spread[str] = Spread()
    for i in range(5):
        spread.put(f"control-{i}", Kind.CONTROL)
    second = spread.lane()
    assert second.poll() is None
    primary = spread.lane(primary=True)
    assert [primary.poll()[1] for _ in range(5)] == [f"control-{i}" for i in range(5)]


def test_heartbeats_overtake_and_are_unordered():
    spread: Spread[str] = Spread()
    spread.put("chunk", Kind.CHUNK)
    spread.put("round-end", Kind.CONTROL)
    assert spread.put("beat", Kind.BEAT) == UNORDERED
    primary = spread.lane(primary=True)
    assert primary.poll() == (UNORDERED, "beat")
    assert primary.poll() == (2, "round-end")  # control ahead of queued chunks
    assert primary.poll() == (1, "chunk")


def test_an_unordered_spread_is_one_plain_stream():
    spread: Spread[str] = Spread(ordered=False)
    spread.put("a", Kind.CONTROL)
    spread.put("b", Kind.CHUNK)
    spread.put("beat", Kind.BEAT)
    primary = spread.lane(primary=True)
    assert [primary.poll() for _ in range(3)] == [(0, "beat"), (0, "a"), (0, "b")]
    with pytest.raises(ValueError, match="only its primary lane"):
        spread.lane()


def test_a_dead_lanes_unacknowledged_chunks_go_to_the_others_and_acknowledged_ones_do_not():
    spread: Spread[str] = Spread()
    for i in range(4):
        spread.put(f"chunk-{i}", Kind.CHUNK)
    primary, second = spread.lane(primary=True), spread.lane()
    assert [second.poll() for _ in range(3)] == [(1, "chunk-0"), (2, "chunk-1"), (3, "chunk-2")]
    spread.acked(1)  # the peer holds chunk-0
    second.end()
    assert second.poll() is None  # an ended lane takes nothing more
    assert [primary.poll() for _ in range(3)] == [(2, "chunk-1"), (3, "chunk-2"), (4, "chunk-3")]
    assert spread.resent == 2


def test_the_merge_drops_copies_and_waits_for_gaps():
    out: list[str] = []
    merge: Merge[str] = Merge(out.append, max_held_bytes=100)
    merge.add(2, "b", 10)
    assert out == []
    merge.add(1, "a", 10)
    merge.add(2, "b", 10)  # a resend of what already arrived
    merge.add(UNORDERED, "beat", 10)
    assert out == ["a", "b", "beat"]
    assert merge.duplicates == 1
    assert merge.received == 2


def test_a_peer_that_runs_too_far_ahead_of_a_gap_is_refused():
    merge: Merge[str] = Merge(lambda _: None, max_held_bytes=100)
    merge.add(2, "b", 60)
    with pytest.raises(ProtocolError, match="3 arrived while 1 is missing"):
        merge.add(3, "c", 60)
    with pytest.raises(ProtocolError, match="negative"):
        merge.add(-1, "x", 1)


def test_lanes_on_threads_with_one_dying_midway_deliver_everything_once():
    """Real threads: three lanes pull concurrently with random delays, so chunks arrive out
    of order; one dies after a few messages, losing the one it was sending."""
    spread: Spread[int] = Spread()
    out: list[int] = []
    merge: Merge[int] = Merge(out.append, max_held_bytes=1 << 30)
    total = 400

    def run(lane, dies_after: int | None) -> None:
        rng = random.Random(lane.index)
        for count, (position, item) in enumerate(lane):
            if dies_after is not None and count == dies_after:
                lane.end()  # what it took and the peer has not acknowledged is lost
                return
            if rng.random() < 0.5:
                time.sleep(0.0005)
            merge.add(position, item, 1)
            spread.acked(merge.received)

    lanes = [spread.lane(primary=True), spread.lane(), spread.lane()]
    threads = [
        threading.Thread(target=run, args=(lane, 20 if lane.index == 2 else None)) for lane in lanes
    ]
    for t in threads:
        t.start()
    for i in range(total):
        spread.put(i, Kind.CHUNK if i % 10 else Kind.CONTROL)
    # A lane blocks for its next message once it has delivered what it took, so the merge
    # completes while every lane still runs: a lost chunk can only come back by a resend.
    deadline = time.monotonic() + 20
    while merge.received < total and time.monotonic() < deadline:
        time.sleep(0.01)
    spread.close()
    for t in threads:
        t.join(timeout=10)
    assert out == list(range(total))
    assert spread.resent >= 1, "the dying lane gave nothing back: it did not die holding a chunk"


def test_messages_queued_before_ordering_starts_are_delivered_first():
    spread: Spread[str] = Spread(ordered=False)
    primary = spread.lane(primary=True)
    spread.put("hello", Kind.CONTROL)
    spread.start_ordering()
    spread.put("welcome", Kind.CONTROL)
    spread.put("chunk", Kind.CHUNK)
    second = spread.lane()
    assert second.poll() == (2, "chunk")
    out: list[str] = []
    merge: Merge[str] = Merge(out.append, max_held_bytes=100)
    merge.add(2, "chunk", 1)
    for position, item in (primary.poll(), primary.poll()):
        merge.add(position, item, 1)
    assert out == ["hello", "welcome", "chunk"]

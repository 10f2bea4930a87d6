"""The payload pool lends a buffer again only once nothing made from it is alive."""

from __future__ import annotations

import numpy as np
import torch

from skyfed.compression import make_codec
from skyfed.compression.feedback import ErrorFeedback
from skyfed.coordinator.payload_pool import PayloadPool
from skyfed.proto import serde
from skyfed.proto.chunks import cut
from skyfed.proto.outbox import Outbox
from skyfed.wire import Payload

MIB = 1 << 20


def _address(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).ctypes.data


def test_a_buffer_let_go_is_lent_again_without_new_memory():
    pool = PayloadPool()
    first = pool.take(4 * MIB)
    where = _address(first)
    del first
    again = pool.take(4 * MIB)
    assert _address(again) == where
    assert pool.nbytes == 4 * MIB


def test_a_buffer_is_not_lent_while_a_view_of_it_lives():
    pool = PayloadPool()
    payload = pool.take(MIB)
    payload[:3] = b"abc"
    part = payload[1:2]  # a slice of it, a tensor over it: each holds the memory
    values = torch.frombuffer(payload, dtype=torch.uint8)
    del payload
    other = pool.take(MIB)
    other[:3] = b"xyz"
    assert bytes(part) == b"b" and bytes(values[:3].numpy()) == b"abc"
    del part, values, other
    assert pool.nbytes == 2 * MIB
    pool.take(MIB)
    assert pool.nbytes == 2 * MIB  # one of the two, free again


def test_a_small_payload_does_not_take_a_buffer_twice_its_size():
    pool = PayloadPool()
    del_me = pool.take(8 * MIB)
    del del_me
    small = pool.take(2 * MIB)
    assert pool.nbytes == 10 * MIB
    assert len(small) == 2 * MIB
    fits = pool.take(5 * MIB)  # the 8 MiB buffer, free, under twice 5 MiB
    assert len(fits) == 5 * MIB and pool.nbytes == 10 * MIB


def test_a_sweep_lets_go_of_buffers_no_round_took():
    pool = PayloadPool()
    a, b = pool.take(MIB), pool.take(2 * MIB)
    del a, b
    assert pool.sweep() == 0  # both taken since the last sweep: kept for the next round
    kept = pool.take(MIB)
    assert pool.sweep() == 2 * MIB  # the 2 MiB one sat free through a round
    assert pool.nbytes == MIB
    assert pool.sweep() == 0  # still lent: never let go under its holder
    del kept
    assert pool.sweep() == MIB and pool.nbytes == 0


def test_letting_go_keeps_only_the_buffers_still_lent():
    pool = PayloadPool()
    held, free = pool.take(MIB), pool.take(2 * MIB)
    del free
    assert pool.let_go() == 2 * MIB
    assert pool.nbytes == MIB
    held[:1] = b"x"  # still its holder's
    del held
    assert pool.let_go() == MIB and pool.nbytes == 0


def test_a_payload_encoded_into_pool_memory_stays_as_sent_while_it_is_held():
    pool = PayloadPool()
    codec = make_codec("fp16")
    g = torch.randn(300, 70, generator=torch.Generator().manual_seed(0)) * 1e-7  # scaled
    kept, plain = ErrorFeedback(memory=pool.take), ErrorFeedback()
    first = dict(kept.encode(codec, [("w", g)]))["w"]
    sent = bytes(first)
    assert sent == bytes(dict(plain.encode(codec, [("w", g)]))["w"])
    second = dict(kept.encode(codec, [("w", g * 3)]))["w"]
    assert bytes(first) == sent and bytes(second) != sent  # the held one kept its memory
    assert bytes(second) == bytes(dict(plain.encode(codec, [("w", g * 3)]))["w"])
    assert torch.equal(kept.residuals["w"], plain.residuals["w"])
    del first, second
    pool.let_go()
    assert pool.nbytes == 0


def test_a_pooled_payload_is_not_lent_while_a_queued_chunk_of_it_lives():
    pool = PayloadPool()
    content = bytes(range(256)) * (3 * MIB // 256)
    memory = pool.take(3 * MIB)
    memory[:] = content
    first = _address(memory)
    payload = Payload(0, None, "fp16", memory)  # type: ignore[arg-type]
    outbox = Outbox()
    for chunk in cut(payload, kind=1, round=0, first_seq=0, max_chunk_bytes=MIB, views=True):
        outbox.put(serde.serialized_chunk(chunk))  # a view of the pool's memory, no copy
    del memory, payload, chunk
    other = pool.take(3 * MIB)  # the queue still refers to the first: a buffer of its own
    second = _address(other)
    assert second != first and pool.nbytes == 6 * MIB
    other[:] = bytes(3 * MIB)
    outbox.close()
    sent = [serde.coordinator_message_bytes(m) for m in outbox]
    eager = cut(
        Payload(0, None, "fp16", content), kind=1, round=0, first_seq=0, max_chunk_bytes=MIB
    )
    assert sent == [serde.serialized_chunk(c).data for c in eager]  # as queued, unchanged
    del other, outbox
    again = pool.take(3 * MIB)  # both free once the queue is drained: no new memory
    assert _address(again) in {first, second} and pool.nbytes == 6 * MIB

"""Cutting encoded payloads into bounded, checksummed chunks, and putting them back.

Both directions use it: agents cut gradients, the coordinator cuts aggregates and weights.
The assembler checks every chunk before it is used, so a bad chunk raises a domain error
and nothing half-assembled leaves it. Framing only: chunks are ``skyfed.wire.Chunk``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np

from skyfed.errors import ChecksumError, OversizedError, ProtocolError
from skyfed.wire import Chunk, Payload

DEFAULT_MAX_CHUNK_BYTES = 1 << 20


class AssemblyBuffer(Protocol):
    """Where a payload of several chunks is put together: each chunk's bytes written at
    their place, the whole read back as one view (a ``memoryview``, or a file's region)."""

    def __setitem__(self, index: slice, data: bytes, /) -> None: ...

    def __getitem__(self, index: slice, /) -> memoryview: ...


def cut(
    payload: Payload,
    *,
    kind: int,
    round: int,
    first_seq: int,
    max_chunk_bytes: int,
    views: bool = False,
    term: int = 0,
) -> Iterator[Chunk]:
    """Chunks for one payload, numbered from ``first_seq``; an empty payload is one chunk.
    ``term``: the leader's, on what a coordinator replica sends (docs/failover.md).

    ``views``: each chunk's data is a memoryview of the payload's memory, not a copy, so
    the payload's memory lives as long as any of its chunks (the broadcast's queue holds
    the pooled payloads themselves, docs/scale.md, Streams); else each is ``bytes``."""
    data = memoryview(payload.data).cast("B") if views else payload.data
    parts = max(1, -(-len(data) // max_chunk_bytes))
    for part in range(parts):
        piece = data[part * max_chunk_bytes : (part + 1) * max_chunk_bytes]
        if (
            not views
        ):  # bytes for protobuf: a slice of bytes already is one; a memoryview's is copied
            piece = bytes(piece)
        yield Chunk(
            kind=kind,
            round=round,
            tensor=payload.tensor,
            shard=payload.shard,
            codec=payload.codec,
            seq=first_seq + part,
            part=part,
            parts=parts,
            data=piece,  # type: ignore[arg-type]  # a memoryview with ``views``: bytes-like
            crc32=zlib.crc32(piece),
            term=term,
        )


def cut_all(
    payloads: list[Payload], *, kind: int, round: int, max_chunk_bytes: int, term: int = 0
) -> list[Chunk]:
    """Chunks for a whole transfer (contribution, aggregate, weights), numbered from 0."""
    return list(
        cut_each(payloads, kind=kind, round=round, max_chunk_bytes=max_chunk_bytes, term=term)
    )


def cut_each(
    payloads: list[Payload], *, kind: int, round: int, max_chunk_bytes: int, term: int = 0
) -> Iterator[Chunk]:
    """:func:`cut_all`'s chunks one at a time, so each can be sent (and its copy of the
    data dropped) before the next is cut."""
    seq = 0
    for payload in payloads:
        for chunk in cut(
            payload,
            kind=kind,
            round=round,
            first_seq=seq,
            max_chunk_bytes=max_chunk_bytes,
            term=term,
        ):
            seq += 1
            yield chunk


class Assembler:
    """Validates one stream of chunks (one contribution, aggregate or weights transfer).

    Invariants: sequence numbers run 0, 1, 2, ... with no gap or repeat; the pieces of one
    payload arrive in order and name the same tensor, shard and codec; no payload grows
    beyond ``max_payload_bytes(tensor)``.
    """

    def __init__(
        self,
        *,
        kind: int,
        round: int | None,
        num_tensors: int,
        max_chunk_bytes: int,
        max_payload_bytes: list[int],
        memory: Callable[[int, str], AssemblyBuffer] | None = None,
    ) -> None:
        """``memory(nbytes, codec)`` lends the buffer a payload of several chunks, of the
        codec its chunks name, is copied into (writable, not zeroed: pooled memory,
        ``coordinator/payload_pool.py``, or a region of a file, ``coordinator/spill.py``); new
        numpy memory without it. ``round`` None: the round of the first chunk (a weights
        transfer's)."""
        self.kind = kind
        self.round = round
        self.num_tensors = num_tensors
        self.max_chunk_bytes = max_chunk_bytes
        self.max_payload_bytes = max_payload_bytes
        self.next_seq = 0
        self._open: Chunk | None = None
        # A payload of several chunks is copied into one buffer as its chunks come, each
        # dropped at once: not all its pieces and then their join (two copies at once).
        # The buffer is numpy's: not zeroed first (a bytearray is), and numpy asks for
        # huge pages for large arrays, so a 50 MB payload costs 8.5 CPU-ms to assemble
        # here against 29 (docs/scale.md).
        self._memory = _uninitialized if memory is None else memory
        self._buffer: AssemblyBuffer = memoryview(b"")
        self._size = 0

    def add(self, chunk: Chunk) -> Payload | None:
        """Check one chunk; return the payload it completes, if any."""
        self._check_envelope(chunk)
        self._check_continuity(chunk)
        self.next_seq += 1
        end = self._size + len(chunk.data)
        bound = self.max_payload_bytes[chunk.tensor]
        if end > bound:
            raise OversizedError(f"payload for tensor {chunk.tensor} exceeds {bound} bytes")
        if chunk.parts == 1:  # the whole payload in one chunk: no copy
            self._open, self._size = None, 0
            return Payload(chunk.tensor, chunk.shard, chunk.codec, chunk.data)
        if chunk.part == 0:  # sized by what it claims, within the payload's bound
            self._buffer = self._memory(min(chunk.parts * self.max_chunk_bytes, bound), chunk.codec)
        # (end <= parts * max_chunk_bytes: every chunk is checked against that bound)
        self._buffer[self._size : end] = chunk.data
        self._size = end
        if chunk.part + 1 < chunk.parts:
            self._open = chunk
            return None
        data = self._buffer[:end]
        self._open, self._buffer, self._size = None, memoryview(b""), 0
        return Payload(chunk.tensor, chunk.shard, chunk.codec, data)  # type: ignore[arg-type]

    @property
    def mid_payload(self) -> bool:
        return self._open is not None

    def _check_envelope(self, chunk: Chunk) -> None:
        if chunk.kind != self.kind:
            raise ProtocolError(f"chunk kind {chunk.kind} where kind {self.kind} was expected")
        if chunk.round != self.round:
            raise ProtocolError(f"chunk for round {chunk.round} inside round {self.round}")
        if len(chunk.data) > self.max_chunk_bytes:
            raise OversizedError(
                f"chunk of {len(chunk.data)} bytes exceeds the {self.max_chunk_bytes}-byte bound"
            )
        if zlib.crc32(chunk.data) != chunk.crc32:
            raise ChecksumError(f"chunk seq {chunk.seq} fails its crc32 check")
        if chunk.seq != self.next_seq:
            word = "repeats" if chunk.seq < self.next_seq else "skips ahead of"
            raise ProtocolError(f"chunk seq {chunk.seq} {word} expected seq {self.next_seq}")
        if chunk.tensor >= self.num_tensors:
            raise ProtocolError(f"chunk names tensor {chunk.tensor} of {self.num_tensors}")
        if not 0 <= chunk.part < chunk.parts:
            raise ProtocolError(f"chunk part {chunk.part} of {chunk.parts} is out of range")

    def _check_continuity(self, chunk: Chunk) -> None:
        prev = self._open
        if prev is None:
            if chunk.part != 0:
                raise ProtocolError(f"payload starts at part {chunk.part}, not 0")
            return
        same = (prev.tensor, prev.codec, prev.parts, prev.shard) == (
            chunk.tensor,
            chunk.codec,
            chunk.parts,
            chunk.shard,
        )
        if not same or chunk.part != prev.part + 1:
            raise ProtocolError(
                f"chunk seq {chunk.seq} interrupts the payload of tensor {prev.tensor} "
                f"(part {prev.part + 1} of {prev.parts} expected)"
            )


def _uninitialized(nbytes: int, codec: str = "") -> memoryview:
    """``nbytes`` of writable memory, not zeroed (a bytes-like view a codec reads)."""
    return memoryview(np.empty(nbytes, dtype=np.uint8))

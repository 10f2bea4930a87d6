"""The payload frame shared by every codec: a fixed header, codec parameters, a body.

Layout (little-endian)::

    magic "SKFD" | version u8 | codec u8 | flags u8 | ndim u8 | shape u64 x ndim |
    params_len u32 | params | body

``flags`` bit 0 means the body is zstd-compressed. The frame carries no checksum: the
chunk that carries it does.
"""

from __future__ import annotations

import math
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import torch
import zstandard

from skyfed.compression.base import PayloadError, check_shape

MAGIC = b"SKFD"
VERSION = 1
FLAG_ZSTD = 1
MAX_NDIM = 8
# A decoded tensor may not claim more elements than this (2**31 floats = 8 GiB); a tensor
# shard larger than that is split by the caller before it is encoded.
MAX_NUMEL = 1 << 31
_HEAD = struct.Struct("<4sBBBB")
_PARAMS_LEN = struct.Struct("<I")

# zstandard compressor objects are not thread-safe: one per thread.
_local = threading.local()

Buffer: TypeAlias = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class Frame:
    codec: int
    shape: tuple[int, ...]
    params: bytes
    body: memoryview
    """The body, zero-copy where it was not compressed."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class PayloadBuffer:
    """Memory a caller owns and lends to encoders, so large payloads need no fresh memory.

    Fresh memory costs a page fault per 4 KiB on first touch: for a 32 MB FP16 payload
    that is more than the conversion itself (3-4x it on the 2-core development host). A
    payload encoded into a buffer is a ``memoryview`` over it, valid until the next encode
    into the same buffer; keep one buffer per tensor (like its error-feedback residual),
    or ``bytes(payload)`` to keep it, or call :meth:`renew_if_held` before each encode
    (what the federation's senders do, ``skyfed/feedback_encode.py``).
    """

    def __init__(self, memory: Callable[[int], memoryview] | None = None) -> None:
        """``memory(nbytes)`` lends writable memory to grow into (a pool that keeps it
        mapped between rounds, ``skyfed/payload_pool.py``); new numpy memory without it."""
        # numpy memory: every tensor, array and memoryview made from it holds a reference
        # to this array, so its reference count says whether a payload is still held.
        self._memory_B = np.empty(0, dtype=np.uint8)
        self._memory = memory

    def take(self, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` as a 1-D uint8 tensor; the memory is replaced only to grow,
        so a payload still held from before keeps the old memory alive and unchanged."""
        if self._memory_B.size < nbytes:
            # 1/8 spare: a sparse codec's payload varies by a few % from round to round.
            size = nbytes + nbytes // 8
            if self._memory is None:
                self._memory_B = np.empty(size, dtype=np.uint8)
            else:
                self._memory_B = np.frombuffer(self._memory(size), dtype=np.uint8)
        return torch.from_numpy(self._memory_B[:nbytes])

    @property
    def held(self) -> bool:
        """Whether anything made from this memory (a payload, a slice of one, a chunk's
        view) is still alive anywhere."""
        # The attribute's own reference and getrefcount's argument: 2 when nothing else.
        return sys.getrefcount(self._memory_B) > 2

    def renew_if_held(self) -> None:
        """Start the next payload in new memory if the last one is still held (an
        unacknowledged upload, a broadcast still queued), else reuse this memory: a
        payload is never overwritten while anyone holds it."""
        if self.held:
            self._memory_B = np.empty(0, dtype=np.uint8)


def header(codec: int, shape: tuple[int, ...], params: bytes, *, flags: int = 0) -> bytes:
    """Everything before the body; its length is a multiple of 4 whenever ``params``'s is,
    so a body of 2- or 4-byte elements can be written in place right after it."""
    head = _HEAD.pack(MAGIC, VERSION, codec, flags, len(shape))
    dims = struct.pack(f"<{len(shape)}Q", *shape)
    return b"".join((head, dims, _PARAMS_LEN.pack(len(params)), params))


def pack(
    codec: int,
    shape: tuple[int, ...],
    params: bytes,
    *body: Buffer | np.ndarray,
    zstd: bool = False,
    out: PayloadBuffer | None = None,
) -> bytes | memoryview:
    """Frame a body given as one or more buffers, joined with one copy (into ``out``,
    when given, and then a view of it is returned).

    ``zstd`` compresses the body (only where a measurement says it pays).
    """
    if zstd:
        body = (compress(b"".join(body)),)
    pieces = (header(codec, shape, params, flags=FLAG_ZSTD if zstd else 0), *body)
    if out is None:
        return b"".join(pieces)
    views = [memoryview(p).cast("B") for p in pieces]
    region_B = out.take(sum(v.nbytes for v in views)).numpy()
    offset = 0
    for v in views:
        region_B[offset : offset + v.nbytes] = np.frombuffer(v, dtype=np.uint8)
        offset += v.nbytes
    return memoryview(region_B)


def compress(data: Buffer) -> bytes:
    """zstd at the level every codec uses (fast: the WAN, not the CPU, is the bottleneck)."""
    compressor = getattr(_local, "zstd", None)
    if compressor is None:
        compressor = _local.zstd = zstandard.ZstdCompressor(level=1)
    return compressor.compress(data)


def unpack(payload: Buffer, *, max_body: int, shape: tuple[int, ...] | None = None) -> Frame:
    """Parse and check a frame; ``max_body`` bounds the decompressed body in bytes.

    ``shape``, when given, is the shape the caller expects: a frame claiming another is
    refused before its body is looked at (decompressed or sized), so a small frame
    cannot make the receiver allocate for the tensor it claims.
    """
    if len(payload) < _HEAD.size:
        raise PayloadError(f"payload of {len(payload)} bytes is shorter than a frame header")
    magic, version, codec, flags, ndim = _HEAD.unpack_from(payload)
    if magic != MAGIC:
        raise PayloadError("payload does not start with the skyfed frame magic")
    if version != VERSION:
        raise PayloadError(f"frame version {version} is not supported (expected {VERSION})")
    if ndim > MAX_NDIM or flags & ~FLAG_ZSTD:
        raise PayloadError(f"frame header is corrupt (ndim={ndim}, flags={flags:#x})")
    offset = _HEAD.size
    end = offset + 8 * ndim + _PARAMS_LEN.size
    if len(payload) < end:
        raise PayloadError("payload is truncated inside its shape")
    claimed = tuple(struct.unpack_from(f"<{ndim}Q", payload, offset))
    check_shape(claimed, shape)
    if math.prod(claimed) > MAX_NUMEL:
        raise PayloadError(f"frame claims {math.prod(claimed)} elements, more than {MAX_NUMEL}")
    (params_len,) = _PARAMS_LEN.unpack_from(payload, offset + 8 * ndim)
    if len(payload) < end + params_len:
        raise PayloadError("payload is truncated inside its codec parameters")
    view = memoryview(payload)
    params = bytes(view[end : end + params_len])
    body = view[end + params_len :]
    if flags & FLAG_ZSTD:
        body = memoryview(decompress(body, max_body))
    return Frame(codec, claimed, params, body)


def decompress(data: Buffer, max_size: int) -> bytes:
    """Decompress one zstd frame of at most ``max_size`` bytes, or raise PayloadError.

    The size a zstd header claims is checked before anything is allocated: the library
    itself trusts it over ``max_output_size``.
    """
    try:
        claimed = zstandard.frame_content_size(data)
        if claimed > max_size:
            raise PayloadError(f"zstd body claims {claimed} bytes, at most {max_size} allowed")
        if max_size == 0:
            raise PayloadError("zstd body where none is allowed")
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=max_size)
    except zstandard.ZstdError as exc:
        raise PayloadError(f"payload body does not decompress: {exc}") from exc

"""The payload frame shared by every codec: a compact header, codec parameters, a body.

Layout (version 2; varints are unsigned LEB128)::

    version u8 (2) | codec u8 | flags u4, ndim u4 (ndim in the high nibble) |
    shape: ndim varints | params_len varint | params | zero padding | body

The padding (0-3 bytes) puts the body on a multiple of 4 bytes, so a body of 2- or 4-byte
elements is written in place right after the header. Version 1 began with the magic
``SKFD`` and spent 8 bytes a dimension and 4 on the parameters' length: 28 bytes before
the parameters of a 2-D tensor, against 7 here. On the bench's small models, 37 tensors of
which 22 are biases and norms, those bytes were 14 % of an EC-SGD 1-bit contribution
(docs/outer-optimizer.md, What bounds the ratio). The frame carries no checksum or
magic: the chunk that carries it has a crc32, and every length is checked exactly.

``flags`` bit 0 means the body is zstd-compressed.
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import torch
import zstandard

from skyfed.compression.base import PayloadError, check_shape

VERSION = 2
V1_MAGIC = b"SKFD"
"""How a version-1 frame began: named in the error that refuses one."""
FLAG_ZSTD = 1
MAX_NDIM = 8
ALIGN = 4
"""The body starts on a multiple of this many bytes from the frame's start."""
# A decoded tensor may not claim more elements than this (2**31 floats = 8 GiB); a tensor
# shard larger than that is split by the caller before it is encoded.
MAX_NUMEL = 1 << 31
_HEAD = struct.Struct("<BBB")
# A varint of a length or a dimension: at most 2**63, 9 bytes of 7 bits; more is corrupt.
_MAX_VARINT_BYTES = 9

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
    into the same buffer: the federation's senders take a new buffer for every payload
    (``ErrorFeedback.buffer``), or ``bytes(payload)`` keeps one.
    """

    def __init__(self, memory: Callable[[int], memoryview] | None = None) -> None:
        """``memory(nbytes)`` lends writable memory to grow into (a pool that keeps it
        mapped between rounds, ``coordinator/payload_pool.py``); new numpy memory without it."""
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


def header(codec: int, shape: tuple[int, ...], params: bytes, *, flags: int = 0) -> bytes:
    """Everything before the body, padded to a multiple of :data:`ALIGN` bytes."""
    if len(shape) > MAX_NDIM:
        raise ValueError(f"a frame holds at most {MAX_NDIM} dimensions, not {len(shape)}")
    head = bytearray(_HEAD.pack(VERSION, codec, flags | len(shape) << 4))
    for d in shape:
        put_varint(head, d)
    put_varint(head, len(params))
    head += params
    head += bytes(-len(head) % ALIGN)
    return bytes(head)


def put_varint(out: bytearray, value: int) -> None:
    """Append ``value`` (>= 0) as an unsigned LEB128 varint."""
    if value < 0:
        raise ValueError(f"a varint is unsigned, not {value}")
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def get_varint(data: Buffer, offset: int, what: str) -> tuple[int, int]:
    """The varint at ``offset`` and the offset after it, or PayloadError naming ``what``."""
    value = 0
    for i in range(_MAX_VARINT_BYTES):
        if offset + i >= len(data):
            raise PayloadError(f"payload is truncated inside its {what}")
        byte = data[offset + i]
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            if byte == 0 and i:  # a longer encoding of a shorter value: one form per value
                raise PayloadError(f"frame header is corrupt (an overlong varint in its {what})")
            return value, offset + i + 1
    raise PayloadError(f"frame header is corrupt (a varint of over {_MAX_VARINT_BYTES} bytes)")


def codec_id(payload: Buffer) -> int:
    """The codec id a frame names, its version checked."""
    if len(payload) < _HEAD.size:
        raise PayloadError(f"payload of {len(payload)} bytes is shorter than a frame header")
    if payload[0] != VERSION:
        if bytes(payload[:4]) == V1_MAGIC:
            raise PayloadError(
                "payload is a version-1 frame (a skyfed from before the compact header): "
                "upgrade the peer that sent it"
            )
        raise PayloadError(f"payload is not a skyfed frame (version byte {payload[0]})")
    return payload[1]


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


def header_length(payload: Buffer) -> int:
    """The bytes before the body (header, codec parameters, padding): what a frame costs
    on top of its data, read without decompressing the body (a bench's byte count)."""
    ndim = payload[2] >> 4
    offset = _HEAD.size
    for _ in range(ndim):
        _, offset = get_varint(payload, offset, "shape")
    params_len, offset = get_varint(payload, offset, "codec parameters' length")
    end = offset + params_len
    return end + -end % ALIGN


def unpack(payload: Buffer, *, max_body: int, shape: tuple[int, ...] | None = None) -> Frame:
    """Parse and check a frame; ``max_body`` bounds the decompressed body in bytes.

    ``shape``, when given, is the shape the caller expects: a frame claiming another is
    refused before its body is looked at (decompressed or sized), so a small frame
    cannot make the receiver allocate for the tensor it claims.
    """
    codec = codec_id(payload)
    flags, ndim = payload[2] & 0x0F, payload[2] >> 4
    if ndim > MAX_NDIM or flags & ~FLAG_ZSTD:
        raise PayloadError(f"frame header is corrupt (ndim={ndim}, flags={flags:#x})")
    offset, dims = _HEAD.size, []
    for _ in range(ndim):
        d, offset = get_varint(payload, offset, "shape")
        dims.append(d)
    claimed = tuple(dims)
    check_shape(claimed, shape)
    if math.prod(claimed) > MAX_NUMEL:
        raise PayloadError(f"frame claims {math.prod(claimed)} elements, more than {MAX_NUMEL}")
    params_len, offset = get_varint(payload, offset, "codec parameters' length")
    end = offset + params_len
    body_at = end + -end % ALIGN
    if len(payload) < body_at:
        raise PayloadError("payload is truncated inside its codec parameters")
    view = memoryview(payload)
    if any(view[end:body_at]):
        raise PayloadError("frame header is corrupt (padding that is not zeros)")
    params = bytes(view[offset:end])
    body = view[body_at:]
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

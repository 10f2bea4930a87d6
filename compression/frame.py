"""The payload frame shared by every codec: a fixed header, codec parameters, a body.

Layout (little-endian)::

    magic "SKFD" | version u8 | codec u8 | flags u8 | ndim u8 | shape u64 x ndim |
    params_len u32 | params | body

``flags`` bit 0 means the body is zstd-compressed. The frame carries no checksum: the
chunk that carries it does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import zstandard

from skyfed.compression.base import PayloadError

MAGIC = b"SKFD"
VERSION = 1
FLAG_ZSTD = 1
MAX_NDIM = 8
# A decoded tensor may not claim more elements than this (2**34 floats = 64 GiB).
MAX_NUMEL = 1 << 34
_HEAD = struct.Struct("<4sBBBB")
_PARAMS_LEN = struct.Struct("<I")

_zstd_c = zstandard.ZstdCompressor(level=1)


@dataclass(frozen=True, slots=True)
class Frame:
    codec: int
    shape: tuple[int, ...]
    params: bytes
    body: bytes

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def pack(codec: int, shape: tuple[int, ...], params: bytes, body: bytes, *, zstd: bool) -> bytes:
    """Frame a body; ``zstd`` compresses the body (only where a measurement says it pays)."""
    flags = 0
    if zstd:
        body = _zstd_c.compress(body)
        flags |= FLAG_ZSTD
    head = _HEAD.pack(MAGIC, VERSION, codec, flags, len(shape))
    dims = struct.pack(f"<{len(shape)}Q", *shape)
    return b"".join((head, dims, _PARAMS_LEN.pack(len(params)), params, body))


def unpack(payload: bytes, *, max_body: int) -> Frame:
    """Parse and check a frame; ``max_body`` bounds the decompressed body in bytes."""
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
    shape = struct.unpack_from(f"<{ndim}Q", payload, offset)
    (params_len,) = _PARAMS_LEN.unpack_from(payload, offset + 8 * ndim)
    if len(payload) < end + params_len:
        raise PayloadError("payload is truncated inside its codec parameters")
    params = payload[end : end + params_len]
    body = payload[end + params_len :]
    if flags & FLAG_ZSTD:
        body = _decompress(body, max_body)
    frame = Frame(codec, tuple(shape), params, body)
    if frame.numel > MAX_NUMEL:
        raise PayloadError(f"frame claims {frame.numel} elements, more than {MAX_NUMEL}")
    return frame


def _decompress(body: bytes, max_body: int) -> bytes:
    try:
        return zstandard.ZstdDecompressor().decompress(body, max_output_size=max_body)
    except zstandard.ZstdError as exc:
        raise PayloadError(f"payload body does not decompress: {exc}") from exc

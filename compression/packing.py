"""Index and bit packing shared by the sparse and quantized codecs (numpy, vectorised)."""

from __future__ import annotations

import numpy as np

from skyfed.compression.base import PayloadError

# Sorted indices below 2**31 give gaps below 2**31: at most 5 varint bytes each.
MAX_VARINT_BYTES = 5


def varint_gaps(indices: np.ndarray) -> np.ndarray:
    """Sorted, distinct int64 indices as LEB128 varints of their gaps minus one.

    ``gap_0 = i_0``, ``gap_j = i_j - i_{j-1} - 1``; at 1 % density most gaps take one byte,
    so every varint's last byte is written in one pass and only the few longer ones get
    their leading bytes in a second.
    """
    gaps = np.diff(indices, prepend=np.int64(-1)) - 1  # (k,)
    long_ = np.flatnonzero(gaps >= 0x80)  # the few varints of more than one byte
    if not len(long_):
        return gaps.astype(np.uint8)
    nbytes_long = np.ones(len(long_), dtype=np.int64)
    for j in range(1, MAX_VARINT_BYTES):
        nbytes_long += gaps[long_] >= (1 << (7 * j))
    nbytes = np.ones(len(gaps), dtype=np.int64)
    nbytes[long_] = nbytes_long
    ends = np.cumsum(nbytes) - 1  # each varint's last byte
    out = np.empty(int(ends[-1]) + 1, dtype=np.uint8)
    out[ends] = (gaps >> (7 * (nbytes - 1))).astype(np.uint8)  # < 0x80: no continuation
    starts_long = ends[long_] - nbytes_long + 1
    for j in range(MAX_VARINT_BYTES - 1):
        rows = np.flatnonzero(nbytes_long > j + 1)
        low7 = (gaps[long_[rows]] >> (7 * j)) & 0x7F
        out[starts_long[rows] + j] = (low7 | 0x80).astype(np.uint8)
    return out


def unvarint_gaps(data: np.ndarray, count: int, numel: int) -> np.ndarray:
    """Inverse of :func:`varint_gaps`: exactly ``count`` sorted int64 indices below ``numel``."""
    ends = np.flatnonzero(data < 0x80)  # each varint's last byte
    if len(ends) != count or (count and ends[-1] != len(data) - 1):
        raise PayloadError(f"index section holds {len(ends)} varints, frame says {count}")
    one_byte_each = len(data) == count
    gaps = data.astype(np.int64) if one_byte_each else _long_gaps(data, ends)
    if count and gaps.max() >= numel:
        raise PayloadError(f"index gap beyond the tensor's {numel} elements")
    indices = np.cumsum(gaps + 1) - 1
    if count and indices[-1] >= numel:
        raise PayloadError(f"index {indices[-1]} is outside the tensor's {numel} elements")
    return indices


def _long_gaps(data: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The gaps of a varint section where some varints take more than one byte."""
    lengths = np.diff(ends, prepend=np.int64(-1))
    long_ = np.flatnonzero(lengths > 1)
    if lengths[long_].max() > MAX_VARINT_BYTES:
        raise PayloadError("index varint longer than any index this frame can hold")
    gaps = data[ends].astype(np.int64)  # the last byte: the highest 7 bits
    gaps[long_] <<= 7 * (lengths[long_] - 1)
    starts_long = ends[long_] - lengths[long_] + 1
    for j in range(MAX_VARINT_BYTES - 1):
        rows = np.flatnonzero(lengths[long_] > j + 1)
        low7 = data[starts_long[rows] + j].astype(np.int64) & 0x7F
        gaps[long_[rows]] |= low7 << (7 * j)
    return gaps


def bitmap(indices: np.ndarray, numel: int) -> np.ndarray:
    """One bit per element (little-endian bit order), set where an index is kept."""
    mask = np.zeros(numel, dtype=bool)
    mask[indices] = True
    return np.packbits(mask, bitorder="little")


def unbitmap(data: np.ndarray, count: int, numel: int) -> np.ndarray:
    """Inverse of :func:`bitmap`: the sorted indices of exactly ``count`` set bits."""
    if len(data) != (numel + 7) // 8:
        raise PayloadError(f"bitmap of {len(data)} bytes for {numel} elements")
    bits = np.unpackbits(data, count=numel, bitorder="little")
    indices = np.flatnonzero(bits)
    if len(indices) != count or (numel % 8 and data[-1] >> (numel % 8)):
        raise PayloadError(f"bitmap sets {len(indices)} bits, frame says {count}")
    return indices

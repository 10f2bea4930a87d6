"""Index and bit packing shared by the sparse and quantized codecs (numpy, vectorised)."""

from __future__ import annotations

import numpy as np

from skyfed.compression.base import PayloadError

# Sorted indices below 2**31 give gaps below 2**31: at most 5 varint bytes each.
MAX_VARINT_BYTES = 5


def varint_gaps(indices: np.ndarray) -> np.ndarray:
    """Sorted, distinct int64 indices as LEB128 varints of their gaps minus one.

    ``gap_0 = i_0``, ``gap_j = i_j - i_{j-1} - 1``; at 1 % density most gaps take one byte.
    """
    gaps = np.diff(indices, prepend=np.int64(-1)) - 1  # (k,)
    gaps = gaps.astype(np.uint64)
    nbytes = np.ones(gaps.shape, dtype=np.int64)
    for j in range(1, MAX_VARINT_BYTES):
        nbytes += gaps >= np.uint64(1 << (7 * j))
    ends = np.cumsum(nbytes)
    starts = ends - nbytes
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.uint8)
    for j in range(int(nbytes.max(initial=0))):
        rows = np.flatnonzero(nbytes > j) if j else slice(None)
        more = (nbytes[rows] > j + 1).astype(np.uint8) << 7
        low7 = ((gaps[rows] >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        out[starts[rows] + j] = low7 | more
    return out


def unvarint_gaps(data: np.ndarray, count: int, numel: int) -> np.ndarray:
    """Inverse of :func:`varint_gaps`: exactly ``count`` sorted int64 indices below ``numel``."""
    ends = np.flatnonzero(data < 0x80) + 1  # one past each varint's last byte
    if len(ends) != count or (count and ends[-1] != len(data)):
        raise PayloadError(f"index section holds {len(ends)} varints, frame says {count}")
    starts = np.concatenate(([0], ends[:-1]))
    lengths = ends - starts
    if count and lengths.max() > MAX_VARINT_BYTES:
        raise PayloadError("index varint longer than any index this frame can hold")
    gaps = np.zeros(count, dtype=np.int64)
    for j in range(int(lengths.max(initial=0))):
        rows = np.flatnonzero(lengths > j)
        gaps[rows] |= (data[starts[rows] + j].astype(np.int64) & 0x7F) << (7 * j)
    if count and gaps.max() >= numel:
        raise PayloadError(f"index gap beyond the tensor's {numel} elements")
    indices = np.cumsum(gaps + 1) - 1
    if count and indices[-1] >= numel:
        raise PayloadError(f"index {indices[-1]} is outside the tensor's {numel} elements")
    return indices


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

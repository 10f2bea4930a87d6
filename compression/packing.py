"""Index and bit packing shared by the sparse and quantized codecs (numpy, vectorised)."""

from __future__ import annotations

import numpy as np
import torch

from skyfed.compression.base import PayloadError

# Sorted indices below 2**31 give gaps below 2**31: at most 5 varint bytes each.
MAX_VARINT_BYTES = 5


def varint_gaps(indices: np.ndarray) -> np.ndarray:
    """Sorted, distinct int64 indices as LEB128 varints of their gaps minus one.

    ``gap_0 = i_0``, ``gap_j = i_j - i_{j-1} - 1``. At 1-5 % density all but about one gap
    in a thousand takes one byte: every gap is written as its byte in one pass, and only
    the few longer ones get their leading bytes inserted in a second (uint8 work).
    """
    gaps = np.empty(len(indices), dtype=np.int64)  # (k,)
    if len(indices):
        gaps[0] = indices[0]
        np.subtract(indices[1:], indices[:-1], out=gaps[1:])
        gaps[1:] -= 1
    long_ = np.flatnonzero(gaps >= 0x80)  # the few varints of more than one byte
    out = gaps.astype(np.uint8)
    if not len(long_):
        return out
    g_long = gaps[long_]
    nbytes = np.ones(len(long_), dtype=np.int64)
    for j in range(1, MAX_VARINT_BYTES):
        nbytes += g_long >= (1 << (7 * j))
    out[long_] = (g_long >> (7 * (nbytes - 1))).astype(np.uint8)  # the last byte: < 0x80
    leading = [
        (((g_long[rows] >> (7 * j)) & 0x7F) | 0x80, long_[rows], j)
        for j in range(MAX_VARINT_BYTES - 1)
        if len(rows := np.flatnonzero(nbytes > j + 1))
    ]
    # Insertion order must be by varint, then by byte: sort the (position, byte) pairs.
    values = np.concatenate([v for v, _, _ in leading]).astype(np.uint8)
    where = np.concatenate([w for _, w, _ in leading])
    order = np.lexsort((np.concatenate([np.full(len(w), j) for _, w, j in leading]), where))
    return np.insert(out, where[order], values[order])


def unvarint_gaps(data: np.ndarray, count: int, numel: int) -> np.ndarray:
    """Inverse of :func:`varint_gaps`: exactly ``count`` sorted int64 indices below ``numel``."""
    leading = np.flatnonzero(data >= 0x80)  # continuation bytes: the few long varints
    if len(data) - len(leading) != count or (len(data) and data[-1] >= 0x80):
        raise PayloadError(
            f"index section holds {len(data) - len(leading)} varints, frame says {count}"
        )
    gaps = np.delete(data, leading).astype(np.int64) if len(leading) else data.astype(np.int64)
    if len(leading):
        _add_leading_bytes(gaps, data, leading, numel)
    gaps += 1
    torch.cumsum(torch.from_numpy(gaps), 0, out=torch.from_numpy(gaps))  # numpy's: 3-4x slower
    indices = gaps
    indices -= 1
    if count and indices[-1] >= numel:
        raise PayloadError(f"index {indices[-1]} is outside the tensor's {numel} elements")
    return indices


def _add_leading_bytes(gaps: np.ndarray, data: np.ndarray, leading: np.ndarray, numel: int) -> None:
    """Complete the long varints' gaps (holding their last byte) with their leading bytes."""
    first = np.flatnonzero(np.diff(leading, prepend=np.int64(-2)) != 1)  # a run's first byte
    starts = leading[first]
    lengths = np.diff(np.append(first, len(leading))) + 1  # bytes per long varint
    if lengths.max() > MAX_VARINT_BYTES:
        raise PayloadError("index varint longer than any index this frame can hold")
    ends = starts + lengths - 1
    at = ends - (first + lengths - 1)  # the varint's place: its end less continuations before
    value = gaps[at] << (7 * (lengths - 1))
    for j in range(MAX_VARINT_BYTES - 1):
        rows = np.flatnonzero(lengths > j + 1)
        value[rows] |= (data[starts[rows] + j].astype(np.int64) & 0x7F) << (7 * j)
    if value.max() >= numel:
        raise PayloadError(f"index gap beyond the tensor's {numel} elements")
    gaps[at] = value


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
    # 0/1 bytes read as bool: numpy's nonzero on bool is 4-8x its scan of uint8.
    indices = np.flatnonzero(bits.view(bool))
    if len(indices) != count or (numel % 8 and data[-1] >> (numel % 8)):
        raise PayloadError(f"bitmap sets {len(indices)} bits, frame says {count}")
    return indices

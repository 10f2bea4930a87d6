"""Top-k's kept values at 2, 3 or 4 bits: sign and magnitude, a scale per block of them.

Every kept value is at least as large as the threshold that selected it, so the levels
span ``[f, s_b]`` only: ``f = min |v|`` over the tensor (the floor, one per payload) and
``s_b = max |v|`` over each block of ``B`` consecutive kept values (its scale). A value
is its sign bit and ``m``, the nearest of ``M = 2**(bits - 1)`` magnitude levels:

    D(q) = sign * (f + m * (s_b - f) / (M - 1))

so ``|v - D(q)| <= (s_b - f) / (2 (M - 1))`` (half a step), and a level is never spent
on magnitudes below the threshold, as a symmetric quantizer around zero would. Rounding
is to the nearest level, not stochastic: error feedback carries each value's rounding
error into the next round (``e' = p - D(c)``), so bias does not accumulate, and nearest
rounding has a third of stochastic rounding's mean square error per round and needs no
seed (docs/codecs-performance.md). Codes travel as ``bits`` bit planes of ``k`` bits.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from skyfed.compression.base import PayloadError

BITS = (2, 3, 4)
DEFAULT_BLOCK = 128
MAX_BLOCK = 1 << 20


def section_bytes(k: int, bits: int, block: int) -> int:
    """Bytes of the values section: a float32 scale per block, then the bit planes."""
    return 4 * -(-k // block) + bits * -(-k // 8)


def quantize(kept_k: torch.Tensor, bits: int, block: int) -> tuple[bytes, float, torch.Tensor]:
    """``(section, floor, sent_k)``: the wire bytes of ``k`` values, the floor ``f``, and
    what the receiver decodes them to."""
    k = kept_k.numel()
    if k == 0:
        return b"", 0.0, torch.zeros(0)
    mag_k = kept_k.abs()
    floor, peak = float(mag_k.min()), float(mag_k.max())
    if not math.isfinite(peak):
        raise ValueError("top-k input holds inf or NaN among its largest elements")
    floor = float(np.float32(floor))
    scales_nb = _padded(mag_k, block).amax(1)  # (nb,) zero padding cannot raise a peak
    step_k = _per_value(_steps(scales_nb, floor, bits), k, block)
    levels = 2 ** (bits - 1) - 1
    m_k = torch.where(step_k > 0, (mag_k - floor) / step_k, 0.0).round_().clamp_(0, levels)
    codes_k = m_k.to(torch.uint8) | (kept_k < 0).to(torch.uint8) << (bits - 1)
    planes = [
        np.packbits(((codes_k >> j) & 1).numpy().view(bool), bitorder="little") for j in range(bits)
    ]
    section = b"".join([memoryview(scales_nb.numpy()).cast("B"), *planes])
    return section, floor, dequantize(codes_k, scales_nb, floor, bits, block)


def dequantize(
    codes_k: torch.Tensor, scales_nb: torch.Tensor, floor: float, bits: int, block: int
) -> torch.Tensor:
    """The one definition of ``D`` for low-bit values, shared by both ends."""
    k = codes_k.numel()
    step_k = _per_value(_steps(scales_nb, floor, bits), k, block)
    magnitude_k = (codes_k & (2 ** (bits - 1) - 1)).to(torch.float32).mul_(step_k).add_(floor)
    negative_k = (codes_k >> (bits - 1)).bool()
    return torch.where(negative_k, -magnitude_k, magnitude_k)


def decode_section(
    section: memoryview, k: int, bits: int, block: int, floor: float
) -> torch.Tensor:
    """The ``k`` values of a values section, every length and scale checked."""
    if len(section) != section_bytes(k, bits, block):
        raise PayloadError(
            f"topk {bits}-bit values take {len(section)} bytes, {k} values need "
            f"{section_bytes(k, bits, block)}"
        )
    if k == 0:
        return torch.zeros(0)
    nb, plane = -(-k // block), -(-k // 8)
    scales_nb = torch.from_numpy(np.frombuffer(section[: 4 * nb], dtype=np.float32).copy())
    if not (torch.isfinite(scales_nb).all() and float(scales_nb.min()) >= floor):
        raise PayloadError(f"topk block scales must be finite and at least the floor {floor}")
    data = np.frombuffer(section[4 * nb :], dtype=np.uint8)
    codes_k = torch.zeros(k, dtype=torch.uint8)
    for j in range(bits):
        bits_k = np.unpackbits(data[j * plane : (j + 1) * plane], count=k, bitorder="little")
        codes_k |= torch.from_numpy(bits_k) << j
    values_k = dequantize(codes_k, scales_nb, floor, bits, block)
    # f <= |D(q)| <= s_b up to rounding, which can still reach inf next to float32's max.
    if not math.isfinite(float(values_k.abs().max())):
        raise PayloadError("topk payload holds non-finite values")
    return values_k


def _steps(scales_nb: torch.Tensor, floor: float, bits: int) -> torch.Tensor:
    """Each block's magnitude step ``(s_b - f) / (M - 1)``, float32 on both ends."""
    return (scales_nb - floor).div_(2 ** (bits - 1) - 1).clamp_(min=0.0)


def _per_value(per_block_nb: torch.Tensor, k: int, block: int) -> torch.Tensor:
    """A per-block quantity repeated for each of the ``k`` values of its block."""
    return per_block_nb.repeat_interleave(block)[:k]


def _padded(values_k: torch.Tensor, block: int) -> torch.Tensor:
    """``values_k`` as ``(nb, B)`` rows, the last zero-padded."""
    nb = -(-values_k.numel() // block)
    padded = torch.zeros(nb * block, dtype=values_k.dtype)
    padded[: values_k.numel()] = values_k
    return padded.view(nb, block)

"""EC-SGD: error-compensated low-bit quantization of every element, a scale per block."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

from skyfed.compression import frame
from skyfed.compression.base import (
    BLOCK_NUMEL,
    SCRATCH,
    Capabilities,
    Codec,
    PayloadError,
    as_flat_f32,
    check_accumulator,
    expected_shape,
    output_tensor,
    pieces,
    residual_memory,
)
from skyfed.compression.fp import readonly_tensor

_BITS = (1, 2, 4)
_MAX_BLOCK = 1 << 20
# Parameters: bits u8 | block varint (3 bytes at the default block of 1024).
# Stochastic rounding draws one random byte per element: u = (r + 1/2) / 256.
_DITHER_LEVELS = 256
# Per bit width: the uniform quantizer's half-range, in RMS, with the least squared error
# on a Gaussian (Max 1960); the 1-bit sign scales by the mean magnitude instead.
_LEAST_SQUARES_CLIP = {1: 0.0, 2: 1.5, 4: 2.5}
# Larger scales would overflow float32 in D(q) = s * (2 q / (L - 1) - 1) as computed.
MAX_SCALE = 1e38


class EcSgd(Codec):
    """Error-compensated quantized SGD (ECQ-SGD; Wu, Huang, Huang and Zhang, ICML 2018).

    Every block of ``B`` elements of ``p = g + e`` is quantized to ``L = 2**bits`` levels:

    - 2 and 4 bits: ``s = min(max|p_B|, c * rms(p_B))``, ``y = (p / s + 1) (L - 1) / 2``
      clamped to ``[0, L - 1]`` and rounded stochastically, ``q = floor(y + u)``;
      ``D(q) = s (2 q / (L - 1) - 1)``. ``E[D(q)] = p`` for ``|p| <= s``, up to the 8-bit
      dither (``u = (r + 1/2) / 256``: bias below 1/512 of a step). Elements beyond ``s``
      are sent as ``+-s`` and the error feedback carries the rest to the next round.
      ``c`` (``clip``) defaults to the scale of the uniform quantizer with the least
      mean-square error on a Gaussian (Max 1960): 1.5 RMS at 2 bits (step 0.996 sigma),
      2.5 at 4 bits (step 0.335 sigma). Scaling by the block's peak instead makes the
      step as large as the biggest element, which the residual makes stand out: 2 bits
      ended 8.4 % above FP32 in ``bench/convergence.py`` that way, within 1 % of it
      clipped (docs/decisions/ecsgd-block-scale.md). ``clip=0`` scales by the peak.
    - 1 bit: the scaled sign of EF-SGD (Karimireddy, Rebjock, Stich and Jaggi, ICML 2019):
      ``s = mean|p_B|``, ``D(q) = s sign(p)``; biased, which the error feedback corrects.

    The sender keeps ``e' = p - D(q)`` (ECQ-SGD with its decay at 1). Wire cost per
    element: ``bits + 32 / B`` bits. ``seed`` (an int or a sequence of non-negative ints, as
    numpy's ``SeedSequence`` takes them) makes the rounding reproducible; ``None`` draws
    it from the OS.
    """

    name = "ecsgd"
    wire_id = 4
    capabilities = Capabilities(heaviness=40, stochastic=True, color="#D55E00")

    def __init__(
        self,
        bits: int = 2,
        block: int = 1024,
        clip: float | None = None,
        seed: int | Sequence[int] | None = None,
    ) -> None:
        if bits not in _BITS:
            raise ValueError(f"bits must be one of {_BITS}, got {bits!r}")
        if not (8 <= block <= _MAX_BLOCK and block % 8 == 0):
            raise ValueError(f"block must be a multiple of 8 in [8, {_MAX_BLOCK}], got {block!r}")
        clip = _LEAST_SQUARES_CLIP[bits] if clip is None else clip
        if not (clip == 0 or 1.0 <= clip <= 1e3):
            raise ValueError(f"clip must be 0 (the block's peak) or in [1, 1000], got {clip!r}")
        self.bits = bits
        self.block = block
        self.clip = float(clip)
        self._random = np.random.PCG64(seed)
        self._random_lock = threading.Lock()

    def encode(self, x: torch.Tensor, out: frame.PayloadBuffer | None = None) -> bytes:
        """The framed payload: ``bytes``, or a view into ``out`` when one is lent."""
        return self._encode(as_flat_f32(x), tuple(x.shape), out, None, None)

    def encode_with_feedback(
        self,
        g: torch.Tensor,
        residual: torch.Tensor | None,
        out: frame.PayloadBuffer | None = None,
    ) -> tuple[bytes, torch.Tensor]:
        """``e' = p - D(q)`` run by run of blocks while they are in cache, in the
        residual's memory (on a ValueError for a non-finite input it is left part summed)."""
        g_flat = as_flat_f32(g)
        e_flat = residual_memory(g_flat, residual)
        if e_flat is None:  # p is g itself, which stays the caller's
            e_new = torch.empty_like(g_flat)
            payload = self._encode(g_flat, tuple(g.shape), out, None, e_new)
        else:  # p = e + g, summed into the residual's memory run by run
            e_new = e_flat
            payload = self._encode(e_flat, tuple(g.shape), out, g_flat, e_flat)
        return payload, e_new.view(g.shape)

    def encode_into_residual(
        self, p: torch.Tensor, out: frame.PayloadBuffer | None = None
    ) -> bytes:
        """``e' = p - D(q)`` run by run of blocks, written over ``p`` as it goes."""
        if p.dtype != torch.float32 or not p.is_contiguous():
            return super().encode_into_residual(p, out)
        flat = p.view(-1)
        return self._encode(flat, tuple(p.shape), out, None, flat)

    def _encode(
        self,
        flat: torch.Tensor,
        shape: tuple[int, ...],
        out: frame.PayloadBuffer | None,
        add: torch.Tensor | None,
        feedback: torch.Tensor | None,
    ) -> bytes:
        """The payload of ``p = flat (+ add)``, written run by run of whole blocks into its
        frame; with ``feedback`` (1-D, may be ``flat`` itself), ``feedback = p - D(q)``."""
        n, block = flat.numel(), self.block
        nb = -(-n // block)
        head = frame.header(self.wire_id, shape, _params(self.bits, block))
        size = len(head) + 4 * nb + _code_bytes(n, self.bits)
        region_B = (
            SCRATCH.take("ecsgd-payload", size, torch.uint8) if out is None else out.take(size)
        )
        region_B[: len(head)].copy_(torch.frombuffer(bytearray(head), dtype=torch.uint8))
        scales_nb = region_B[len(head) : len(head) + 4 * nb].view(torch.float32)
        packed = region_B[len(head) + 4 * nb :]
        run = max(1, BLOCK_NUMEL // block)  # blocks per run
        for first in range(0, nb, run):
            last = min(nb, first + run)
            lo, hi = first * block, min(n, last * block)
            p_rows = _rows(flat[lo:hi], add[lo:hi] if add is not None else None, block)
            scales = scales_nb[first:last]
            _block_scales(p_rows, self.bits, hi - lo, self.clip, out=scales)
            if not float(scales.max()) <= MAX_SCALE:
                raise ValueError(f"ecsgd input holds inf, NaN or magnitudes above {MAX_SCALE}")
            codes = self._codes(p_rows, scales)
            _pack_rows(codes, self.bits, packed, first, last, block)
            if feedback is not None:
                sent = SCRATCH.take("ecsgd-sent", codes.numel())
                _dequantize_rows(codes, scales, 2.0 / (2**self.bits - 1), sent)
                torch.sub(p_rows.view(-1)[: hi - lo], sent[: hi - lo], out=feedback[lo:hi])
        if out is None:
            return bytes(region_B.numpy())
        return memoryview(region_B.numpy())  # type: ignore[return-value]

    def _codes(self, p_rows: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """The uint8 codes ``(rows * B,)`` of one run of blocks (a per-thread scratch)."""
        codes = SCRATCH.take("ecsgd-codes", p_rows.numel(), torch.uint8)
        if self.bits == 1:
            return torch.ge(p_rows.view(-1), 0, out=codes.view(torch.bool)).view(torch.uint8)
        return self._stochastic_codes(p_rows, scales, codes)

    def _stochastic_codes(
        self, p_rows: torch.Tensor, scales: torch.Tensor, codes: torch.Tensor
    ) -> torch.Tensor:
        """``floor(y + u)`` for ``y = (p / s + 1) (L - 1) / 2``, into uint8 ``codes``.

        In units of 1/256, so the random bytes ``r`` enter as they are:
        ``q = floor((p g + 256 (L - 1) / 2 + r + 1/2) / 256)``, ``g = 256 (L - 1) / (2 s)``.
        """
        half = (2**self.bits - 1) / 2.0
        units = float(_DITHER_LEVELS)
        gain = torch.where(scales > 0, half * units / scales, 0.0).unsqueeze(1)  # (rows, 1)
        z = SCRATCH.take("ecsgd-z", p_rows.numel()).view_as(p_rows)
        torch.add(self._dither(p_rows.numel()).view_as(p_rows), half * units + 0.5, out=z)
        z.addcmul_(p_rows, gain).mul_(1.0 / units).clamp_(0.0, 2.0 * half)
        return codes.copy_(z.view(-1))  # truncation is floor: z >= 0

    def _dither(self, numel: int) -> torch.Tensor:
        with self._random_lock:
            words = self._random.random_raw(-(-numel // 8))
        return torch.from_numpy(words.view(np.uint8)[:numel])

    def decode(
        self,
        payload: bytes,
        out: torch.Tensor | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        f, bits, block, scales_nb, packed = _parse(payload, expected_shape(out, shape))
        result = output_tensor(f.shape, out)
        flat, n = result.view(-1), f.numel
        step, row_bytes = 2.0 / (2**bits - 1), block * bits // 8
        run = max(1, BLOCK_NUMEL // block)  # blocks per run
        for first in range(0, len(scales_nb), run):
            last = min(len(scales_nb), first + run)
            codes = _unpack_codes(_packed_rows(packed, first, last, row_bytes), bits)
            lo, hi = first * block, last * block
            rows = flat[lo:hi] if hi <= n else SCRATCH.take("decoded", hi - lo)
            _dequantize_rows(codes, scales_nb[first:last], step, rows)
            if hi > n:  # the ragged last block
                flat[lo:n] = rows[: n - lo]
        return result

    def decode_add(self, payload: bytes, acc: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        """``acc += alpha * D(q)``, dequantizing a run of whole blocks at a time into one
        temporary of about :data:`BLOCK_NUMEL` elements."""
        check_accumulator(acc)
        _, bits, block, scales_nb, packed = _parse(payload, tuple(acc.shape))
        step = 2.0 / (2**bits - 1)
        row_bytes = block * bits // 8
        decoded = SCRATCH.take("decoded", BLOCK_NUMEL + 2 * block)
        for start, view in pieces(acc, max(block, BLOCK_NUMEL // block * block)):
            first, last = start // block, -(-(start + view.numel()) // block)  # blocks
            codes = _unpack_codes(_packed_rows(packed, first, last, row_bytes), bits)
            rows = decoded[: (last - first) * block]
            _dequantize_rows(codes, scales_nb[first:last], step, rows)
            offset = start - first * block
            view.add_(rows[offset : offset + view.numel()].view(view.shape), alpha=alpha)
        return acc

    def __repr__(self) -> str:
        return f"EcSgd(bits={self.bits}, block={self.block}, clip={self.clip})"


def _parse(
    payload: bytes, shape: tuple[int, ...] | None
) -> tuple[frame.Frame, int, int, torch.Tensor, torch.Tensor]:
    """The frame, bits, block, scales ``(nb,)`` and packed codes, every length checked
    against the expected shape before anything of its size is allocated."""
    f = frame.unpack(payload, max_body=0, shape=shape)
    if f.codec != EcSgd.wire_id:
        raise PayloadError(f"payload is codec {f.codec}, not {EcSgd.name}")
    bits, block = _parse_params(f.params)
    nb = -(-f.numel // block)
    scale_bytes, code_bytes = 4 * nb, _code_bytes(f.numel, bits)
    if len(f.body) != scale_bytes + code_bytes:
        raise PayloadError(
            f"ecsgd body is {len(f.body)} bytes, shape {f.shape} at {bits} bits needs "
            f"{scale_bytes + code_bytes}"
        )
    scales_nb = readonly_tensor(np.frombuffer(f.body[:scale_bytes], dtype=np.float32))
    if nb and not (scales_nb.min() >= 0 and scales_nb.max() <= MAX_SCALE):
        raise PayloadError(f"ecsgd payload has a scale outside [0, {MAX_SCALE}]")
    packed = readonly_tensor(np.frombuffer(f.body[scale_bytes:], dtype=np.uint8))
    return f, bits, block, scales_nb, packed


def _params(bits: int, block: int) -> bytes:
    params = bytearray((bits,))
    frame.put_varint(params, block)
    return bytes(params)


def _parse_params(params: bytes) -> tuple[int, int]:
    if not params:
        raise PayloadError("ecsgd payload has no parameters")
    bits = params[0]
    block, end = frame.get_varint(params, 1, "ecsgd parameters")
    if end != len(params):
        raise PayloadError(f"ecsgd payload has {len(params)} parameter bytes")
    if bits not in _BITS or not (8 <= block <= _MAX_BLOCK and block % 8 == 0):
        raise PayloadError(f"ecsgd parameters are corrupt (bits={bits}, block={block})")
    return bits, block


def _rows(flat: torch.Tensor, add: torch.Tensor | None, block: int) -> torch.Tensor:
    """``p = flat (+= add)`` as ``(rows, B)``; only a ragged last block costs a copy
    (zero padding, in a scratch), and ``flat`` still holds the sum."""
    if add is not None:
        flat.add_(add)
    n = flat.numel()
    if n % block == 0:
        return flat.view(-1, block)
    padded = SCRATCH.take("ecsgd-tail", -(-n // block) * block).zero_()
    padded[:n] = flat
    return padded.view(-1, block)


def _block_scales(
    blocks: torch.Tensor, bits: int, numel: int, clip: float, *, out: torch.Tensor
) -> torch.Tensor:
    """``out (rows,) = min(max|p|, clip * rms(p))`` per block, or ``mean|p|`` for the 1-bit
    sign (the zero padding of a ragged last block does not count)."""
    if blocks.numel() == 0:
        return out
    counts = torch.full((blocks.shape[0],), float(blocks.shape[1]))
    counts[-1] = numel - (blocks.shape[0] - 1) * blocks.shape[1]
    if bits == 1:
        return torch.div(blocks.abs().sum(1), counts, out=out)
    peaks = torch.maximum(blocks.amax(1), blocks.amin(1).neg_())  # 8x aminmax(dim=1)
    if not clip:
        return out.copy_(peaks)
    rms = torch.linalg.vector_norm(blocks, dim=1).div_(counts.sqrt_())
    return torch.minimum(peaks, rms.mul_(clip), out=out)


def _code_bytes(n: int, bits: int) -> int:
    """The codes of ``n`` elements: whole blocks of ``block * bits / 8`` bytes (``block``
    is a multiple of 8), the ragged last block at its own length, not padded to a block.
    A 32-element bias in blocks of 1024 at 2 bits is 8 bytes of codes, not 256."""
    return -(-n * bits // 8)


def _pack_rows(
    codes: torch.Tensor, bits: int, packed: torch.Tensor, first: int, last: int, block: int
) -> None:
    """Pack blocks ``[first, last)`` into their place in ``packed``; a ragged last
    block's codes are packed whole in a scratch and only its own length kept."""
    row_bytes = block * bits // 8
    dest = packed[first * row_bytes : last * row_bytes]
    whole = (last - first) * row_bytes
    if dest.numel() == whole:
        _pack_codes(codes, bits, dest)
        return
    staging = SCRATCH.take("ecsgd-packed", whole, torch.uint8)
    _pack_codes(codes, bits, staging)
    dest.copy_(staging[: dest.numel()])


def _packed_rows(packed: torch.Tensor, first: int, last: int, row_bytes: int) -> torch.Tensor:
    """The packed codes of blocks ``[first, last)``, a ragged last block padded with zero
    codes to a whole one (in a scratch) so that every block unpacks alike."""
    rows = packed[first * row_bytes : last * row_bytes]
    whole = (last - first) * row_bytes
    if rows.numel() == whole:
        return rows
    padded = SCRATCH.take("ecsgd-unpacked", whole, torch.uint8)
    padded[: rows.numel()].copy_(rows)
    padded[rows.numel() :].zero_()
    return padded


def _pack_codes(codes: torch.Tensor, bits: int, out: torch.Tensor) -> None:
    """``8 / bits`` codes per byte into uint8 ``out``, the first in the lowest bits
    (shifts on wide words)."""
    if bits == 1:
        out.copy_(torch.from_numpy(np.packbits(codes.numpy().view(bool), bitorder="little")))
        return
    if bits == 2:
        w = codes.view(torch.int32)  # bytes c0 c1 c2 c3 -> c0 | c1 << 2 | c2 << 4 | c3 << 6
        w = w | (w >> 6)
        out.copy_(w | (w >> 12))  # the low byte of each word
        return
    w = codes.view(torch.int16)  # bytes c0 c1 -> c0 | c1 << 4
    out.copy_(w | (w >> 4))


def _spread_table(bits: int) -> np.ndarray:
    """For each packed byte, its ``8 / bits`` codes as the bytes of one wide word."""
    per_byte = 8 // bits
    byte = np.arange(256, dtype=np.uint32)
    word = np.zeros(256, dtype=np.uint32)
    for j in range(per_byte):
        word |= ((byte >> (bits * j)) & (2**bits - 1)) << (8 * j)
    return word.astype(np.uint32 if per_byte == 4 else np.uint16)


_SPREAD = {2: _spread_table(2), 4: _spread_table(4)}


def _unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`_pack_codes`: uint8 codes ``(8 / bits * len(packed),)``."""
    p = packed.numpy()
    if bits == 1:
        return torch.from_numpy(np.unpackbits(p, bitorder="little"))
    return torch.from_numpy(np.take(_SPREAD[bits], p).view(np.uint8))


def _dequantize_rows(
    codes: torch.Tensor, scales_rows: torch.Tensor, step: float, out: torch.Tensor
) -> None:
    """``out = s (step q - 1)`` row by row of ``len(scales_rows)`` blocks, into ``out``."""
    if out.numel() == 0:
        return
    rows = out.view(scales_rows.numel(), -1)  # (rows, B)
    rows.copy_(codes.view_as(rows))
    scale_col = scales_rows.unsqueeze(1)  # (rows, 1)
    rows.mul_(scale_col * step).sub_(scale_col)

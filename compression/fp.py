"""Element-wise float codecs: FP32 passthrough, FP16 (range-scaled) and BF16."""

from __future__ import annotations

import math
import struct
import warnings
from collections.abc import Iterator

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
    blocks,
    check_accumulator,
    expected_shape,
    output_tensor,
    pieces,
    residual_memory,
)
from skyfed.compression.norms import all_finite, squared_norm

_FP16_MIN_NORMAL = 2.0**-14
# FP16 peak after scaling lands in [2**14, 2**15): no overflow, and small gradients keep
# their precision instead of flushing into subnormals.
_FP16_PEAK_EXP = 14
_FP16_SCALE_EXP_LIMIT = 126  # keeps both s and 1/s finite float32 numbers
_SCALE = struct.Struct("<f")
_NUMPY_DTYPE = {torch.float32: np.float32, torch.float16: np.float16}


class _ElementwiseCodec(Codec):
    """Casts every element to ``wire_dtype``: ``c = cast(x / s)``, ``D(c) = s * c``.

    ``s`` is a power of two (so scaling adds no rounding) chosen by subclasses. Scaling
    goes through a per-thread float32 scratch reused across calls; ``encode(x, out=buf)``
    writes the frame straight into a caller-owned :class:`frame.PayloadBuffer`, so no
    fresh memory is touched. :meth:`encode_with_feedback` and :meth:`decode_add` work
    block by block (``p = g + e``, the cast and ``e' = p - D(c)`` on one block while it is
    in cache; ``acc += alpha D(c)`` through one block-sized temporary).
    """

    wire_dtype: torch.dtype

    def encode(self, x: torch.Tensor, out: frame.PayloadBuffer | None = None) -> bytes:
        """The framed payload: ``bytes``, or a view into ``out`` when one is lent."""
        flat = as_flat_f32(x)
        head_len, wire = self._wire_region(tuple(x.shape), flat.numel(), out)
        return self._framed(tuple(x.shape), self._cast(flat, wire), head_len, wire, out)

    def encode_with_feedback(
        self,
        g: torch.Tensor,
        residual: torch.Tensor | None,
        out: frame.PayloadBuffer | None = None,
    ) -> tuple[bytes, torch.Tensor]:
        """``p = g + e; c = cast(p / s); e' = p - D(c)`` block by block, ``e'`` in the
        residual's memory (a fresh tensor without one). Falls back to the whole-tensor
        path when the plain cast does not hold (FP16 overflow or underflow)."""
        g_flat = as_flat_f32(g)
        e_flat = residual_memory(g_flat, residual)
        summed = e_flat is not None
        e_flat = torch.empty_like(g_flat) if e_flat is None else e_flat
        head_len, wire = self._wire_region(tuple(g.shape), g_flat.numel(), out)
        scale = self._fused_feedback(g_flat, e_flat, summed, wire)
        payload = self._framed(tuple(g.shape), scale, head_len, wire, out)
        return payload, e_flat.view(g.shape)

    def _fused_feedback(
        self, g: torch.Tensor, e: torch.Tensor, summed: bool, wire: torch.Tensor
    ) -> float:
        """Fill ``wire`` and ``e = e'`` (``e`` holds the residual when ``summed``) in one
        pass, the plain cast: a codec whose plain cast always holds (FP32, BF16). FP16,
        whose scale depends on the whole tensor's peak, finds the peak first."""
        decoded = SCRATCH.take("decoded", BLOCK_NUMEL)
        for start in blocks(g.numel()):
            stop = min(start + BLOCK_NUMEL, g.numel())
            g_b, e_b, wire_b = g[start:stop], e[start:stop], wire[start:stop]
            p_b = e_b.add_(g_b) if summed else g_b  # p, in the residual's memory
            wire_b.copy_(p_b)
            torch.sub(p_b, decoded[: stop - start].copy_(wire_b), out=e_b)
        return 1.0

    def _wire_region(
        self, shape: tuple[int, ...], numel: int, out: frame.PayloadBuffer | None
    ) -> tuple[int, torch.Tensor]:
        """The header's length and the tensor the body is cast into: right after the
        header in ``out``, or a per-thread scratch. The header's length does not depend
        on the scale's value, so the body is cast first and the header written last."""
        head_len = len(frame.header(self.wire_id, shape, _SCALE.pack(1.0)))
        if out is None:
            return head_len, SCRATCH.take("wire", numel, self.wire_dtype)
        region_B = out.take(head_len + numel * self.wire_dtype.itemsize)
        return head_len, region_B[head_len:].view(self.wire_dtype)

    def _framed(
        self,
        shape: tuple[int, ...],
        scale: float,
        head_len: int,
        wire: torch.Tensor,
        out: frame.PayloadBuffer | None,
    ) -> bytes:
        head = frame.header(self.wire_id, shape, _SCALE.pack(scale))
        if out is None:
            return head + memoryview(wire.view(torch.uint8).numpy())
        view = memoryview(out.take(head_len + wire.numel() * self.wire_dtype.itemsize).numpy())
        view[:head_len] = head
        return view  # type: ignore[return-value]

    def _cast(self, flat: torch.Tensor, wire: torch.Tensor) -> float:
        """Write ``cast(flat / s)`` into ``wire`` and return ``s`` (here always 1)."""
        wire.copy_(flat)
        return 1.0

    def _cast_scaled(self, flat: torch.Tensor, scale: float, wire: torch.Tensor) -> None:
        """``wire = cast(flat / scale)``; a dtype-mixing multiply is 3x slower than this."""
        scaled = torch.empty_like(flat)  # rare (a scaled frame): no buffer kept per thread
        wire.copy_(torch.mul(flat, 1.0 / scale, out=scaled))

    def decode(
        self,
        payload: bytes,
        out: torch.Tensor | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        f, scale = self._parse(payload, expected_shape(out, shape))
        result = output_tensor(f.shape, out)
        result.view(-1).copy_(self._wire_view(f.body))
        return result if scale == 1.0 else result.mul_(scale)

    def check_pieces(
        self,
        payload: bytes,
        out: torch.Tensor | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> Iterator[float]:
        """Decoded block by block into a per-thread block scratch (in cache), each block
        checked finite and its squares summed (16k-element norms, as ``squared_norm``):
        no tensor-sized buffer, so ``out`` is not needed (only its shape is read)."""
        f, scale = self._parse(payload, expected_shape(out, shape))
        return self._check_blocks(self._wire_view(f.body), scale)

    def _check_blocks(self, wire: torch.Tensor, scale: float) -> Iterator[float]:
        decoded = SCRATCH.take("decoded", BLOCK_NUMEL)
        for start in blocks(wire.numel()):
            wire_b = wire[start : start + BLOCK_NUMEL]
            d = decoded[: wire_b.numel()].copy_(wire_b)
            if scale != 1.0:
                d.mul_(scale)
            if not all_finite(d):
                raise PayloadError("payload holds NaN or Inf values")
            yield squared_norm(d)

    def decode_add_pieces(
        self, payload: bytes, acc: torch.Tensor, alpha: float = 1.0
    ) -> Iterator[None]:
        """``acc += alpha * s * c`` a block at a time (:meth:`Codec.decode_add_pieces`): no
        full-size temporary."""
        check_accumulator(acc)
        f, scale = self._parse(payload, tuple(acc.shape))
        return self._add_pieces(f, scale, acc, alpha)

    def _add_pieces(
        self, f: frame.Frame, scale: float, acc: torch.Tensor, alpha: float
    ) -> Iterator[None]:
        wire = self._wire_view(f.body)
        # The wire added as it is (torch widens each element exactly, then adds as it adds
        # float32: bit for bit, and 1.2x faster than a cast block first). Scaled, ``s``
        # goes into ``alpha`` where that is exact: ``alpha * (s * c)`` and ``(alpha * s) *
        # c`` are then the same real number, rounded once by the same add (one pass over
        # the block, not a cast, a multiply and an add).
        if scale != 1.0 and self.wire_dtype == torch.float16 and _exact_product(alpha, scale):
            alpha, scale = alpha * scale, 1.0
        decoded = None if scale == 1.0 else SCRATCH.take("decoded", BLOCK_NUMEL)
        for start, view in pieces(acc):
            wire_b = wire[start : start + view.numel()]
            if decoded is not None:
                wire_b = decoded[: view.numel()].copy_(wire_b).mul_(scale)
            view.add_(wire_b.view(view.shape), alpha=alpha)
            yield

    def _parse(self, payload: bytes, shape: tuple[int, ...] | None) -> tuple[frame.Frame, float]:
        """The checked frame and its scale; the body's length is checked against the
        shape before anything is allocated."""
        f = frame.unpack(payload, max_body=0, shape=shape)
        if f.codec != self.wire_id:
            raise PayloadError(f"payload is codec {f.codec}, not {self.name}")
        if len(f.params) != _SCALE.size:
            raise PayloadError(f"{self.name} payload has {len(f.params)} parameter bytes")
        (scale,) = _SCALE.unpack(f.params)
        if not (math.isfinite(scale) and scale > 0.0):
            raise PayloadError(f"{self.name} payload has scale {scale}")
        itemsize = self.wire_dtype.itemsize
        if len(f.body) != f.numel * itemsize:
            raise PayloadError(
                f"{self.name} body is {len(f.body)} bytes, shape {f.shape} needs "
                f"{f.numel * itemsize}"
            )
        return f, scale

    def _wire_view(self, body: memoryview) -> torch.Tensor:
        """The body as a read-only 1-D tensor of ``wire_dtype`` (no copy)."""
        if self.wire_dtype == torch.bfloat16:
            return readonly_tensor(np.frombuffer(body, dtype=np.int16)).view(torch.bfloat16)
        return readonly_tensor(np.frombuffer(body, dtype=_NUMPY_DTYPE[self.wire_dtype]))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _exact_product(alpha: float, scale: float) -> bool:
    """Whether ``float32(alpha * scale) == float32(alpha) * scale`` and ``scale * c`` is
    exact in float32 for every FP16 ``c``: ``scale`` a power of two that keeps FP16's
    magnitudes (``2**-24 .. 2**16``) among float32's normal numbers, and ``alpha * scale``
    a normal float32 number."""
    mantissa, exponent = math.frexp(scale)
    if mantissa != 0.5 or not -100 <= exponent - 1 <= 100:
        return False
    product = abs(alpha * scale)
    return 2.0**-126 <= product < 2.0**127


def readonly_tensor(array: np.ndarray) -> torch.Tensor:
    """Wrap a numpy array over a read-only payload without a copy; decoders only read it."""
    return torch.from_numpy(array)


def _consume_readonly_warning() -> None:
    """torch warns once per process when it wraps a read-only array; decoders always do,
    and only ever read from it, so spend that one warning here, silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.from_numpy(np.frombuffer(b"\0\0\0\0", dtype=np.float32))


_consume_readonly_warning()


class Fp32(_ElementwiseCodec):
    """Lossless passthrough: the reference every other codec is measured against."""

    name = "fp32"
    wire_id = 0
    capabilities = Capabilities(heaviness=0, lossless=True, sends_all=True, color="#BBBBBB")
    wire_dtype = torch.float32


def _fp16_rounded(value: float) -> float:
    """``value`` rounded to FP16 as the cast rounds it: inf past FP16's range, which is
    an answer here, not a fault (numpy would warn of the overflow)."""
    with np.errstate(over="ignore"):
        return float(np.float16(value))


class Fp16(_ElementwiseCodec):
    """IEEE half precision, scaled by a power of two ``s`` only where a plain cast fails.

    The fast path is the plain cast PyTorch's DDP FP16 hook and Horovod send, checked on
    its output: one pass over the half-size result finds its peak. Only if that cast
    overflowed (peak inf), or the whole tensor fell below FP16's normal range (peak
    < 2**-14, where it would keep only a few bits, or none), is it redone with
    ``s = 2**(floor(log2(max|x|)) - 14)``, which maps ``max|x / s|`` into
    ``[2**14, 2**15)``. Dividing by a power of two is exact; ``s`` is in the frame (1.0
    on the fast path). Either way every element is within ``2**-11 * max|x|`` of its
    value, the precision FP16 gives the peak itself. A tensor holding inf or NaN is sent
    unscaled (the receiver's validation refuses it).
    """

    name = "fp16"
    wire_id = 1
    capabilities = Capabilities(heaviness=20, sends_all=True, color="#0072B2")
    wire_dtype = torch.float16

    def _fused_feedback(
        self, g: torch.Tensor, e: torch.Tensor, summed: bool, wire: torch.Tensor
    ) -> float:
        """In two passes, the scale known before any cast: ``p`` (in the residual's
        memory) and its peak, then the one cast the peak calls for and ``e' = p - D(c)``.
        7 block operations, where casting plainly first and redoing a tensor that needs
        a scale took 12 (a pseudo-gradient's usually does: docs/scale.md). A tensor
        holding inf or NaN takes the whole-tensor cast, sent unscaled."""
        n = g.numel()
        peak = 0.0
        for start in blocks(n):
            stop = min(start + BLOCK_NUMEL, n)
            p_b = e[start:stop].add_(g[start:stop]) if summed else g[start:stop]
            peak = max(peak, self._block_peak(p_b))
        p = e if summed else g
        if not math.isfinite(_fp16_rounded(peak)):  # overflow, inf or NaN: rounding is monotonic
            scale = self._cast(p, wire)
            d = wire.to(torch.float32)
            if scale != 1.0:
                d.mul_(scale)
            torch.sub(p, d, out=e)
            return scale
        scale = 1.0 if self._plain_cast_holds(peak) else fp16_scale(peak)
        decoded = SCRATCH.take("decoded", BLOCK_NUMEL)
        for start in blocks(n):
            stop = min(start + BLOCK_NUMEL, n)
            p_b, e_b, wire_b = p[start:stop], e[start:stop], wire[start:stop]
            d_b = decoded[: stop - start]
            if scale == 1.0:
                wire_b.copy_(p_b)
                torch.sub(p_b, d_b.copy_(wire_b), out=e_b)
            else:  # as _cast_scaled, then p - D(c) as decode
                wire_b.copy_(torch.mul(p_b, 1.0 / scale, out=d_b))
                torch.sub(p_b, d_b.copy_(wire_b).mul_(scale), out=e_b)
        return scale

    def _block_peak(self, p_block: torch.Tensor) -> float:
        low, high = torch.aminmax(p_block)
        return max(float(high), -float(low))

    def _plain_cast_holds(self, peak: float) -> bool:
        """``peak`` is the input's: the wire's is its FP16 rounding (rounding is monotonic)."""
        wire_peak = _fp16_rounded(peak)
        return math.isfinite(wire_peak) and wire_peak >= _FP16_MIN_NORMAL

    def _cast(self, flat: torch.Tensor, wire: torch.Tensor) -> float:
        wire.copy_(flat)
        if flat.numel() == 0:
            return 1.0
        low, high = torch.aminmax(wire)  # on the half-size output: 1.4x cheaper
        if self._plain_cast_holds(max(float(high), -float(low))):
            return 1.0
        low, high = torch.aminmax(flat)
        scale = fp16_scale(max(float(high), -float(low)))
        if scale != 1.0:
            self._cast_scaled(flat, scale, wire)
        return scale


def fp16_scale(peak: float) -> float:
    """The power of two that maps a largest magnitude ``peak`` into ``[2**14, 2**15)``."""
    if not math.isfinite(peak) or peak == 0.0:
        return 1.0
    exponent = math.frexp(peak)[1] - 1 - _FP16_PEAK_EXP
    return math.ldexp(1.0, min(max(exponent, -_FP16_SCALE_EXP_LIMIT), _FP16_SCALE_EXP_LIMIT))


class Bf16(_ElementwiseCodec):
    """bfloat16: FP32's range with 8 bits of mantissa, so it never overflows."""

    name = "bf16"
    wire_id = 2
    capabilities = Capabilities(heaviness=10, sends_all=True, color="#56B4E9")
    wire_dtype = torch.bfloat16

"""Element-wise float codecs: FP32 passthrough, FP16 (range-scaled) and BF16."""

from __future__ import annotations

import math
import struct
import threading
import warnings

import numpy as np
import torch

from skyfed.compression import frame
from skyfed.compression.base import Codec, PayloadError, as_flat_f32, output_tensor

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
    fresh memory is touched. Scaling block by block to stay in cache was measured too: on
    a busy 2-core host its many small parallel kernels wait on each other, up to 10x slower.
    """

    wire_dtype: torch.dtype
    bounded_release = True

    def __init__(self) -> None:
        self._local = threading.local()

    def encode(self, x: torch.Tensor, out: frame.PayloadBuffer | None = None) -> bytes:
        """The framed payload: ``bytes``, or a view into ``out`` when one is lent."""
        flat = as_flat_f32(x)
        if out is None:
            wire = self._scratch("wire", flat.numel(), self.wire_dtype)
            scale = self._cast(flat, wire)
            head = frame.header(self.wire_id, tuple(x.shape), _SCALE.pack(scale))
            return head + memoryview(wire.view(torch.uint8).numpy())
        # The header's length does not depend on the scale's value: cast first, head last.
        head_len = len(frame.header(self.wire_id, tuple(x.shape), _SCALE.pack(1.0)))
        region_B = out.take(head_len + flat.numel() * self.wire_dtype.itemsize)
        scale = self._cast(flat, region_B[head_len:].view(self.wire_dtype))
        view = memoryview(region_B.numpy())
        view[:head_len] = frame.header(self.wire_id, tuple(x.shape), _SCALE.pack(scale))
        return view  # type: ignore[return-value]

    def _cast(self, flat: torch.Tensor, wire: torch.Tensor) -> float:
        """Write ``cast(flat / s)`` into ``wire`` and return ``s`` (here always 1)."""
        wire.copy_(flat)
        return 1.0

    def _cast_scaled(self, flat: torch.Tensor, scale: float, wire: torch.Tensor) -> None:
        """``wire = cast(flat / scale)``; a dtype-mixing multiply is 3x slower than this."""
        scaled = self._scratch("scaled", flat.numel(), torch.float32)
        wire.copy_(torch.mul(flat, 1.0 / scale, out=scaled))

    def decode(self, payload: bytes, out: torch.Tensor | None = None) -> torch.Tensor:
        f = frame.unpack(payload, max_body=0)
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
        result = output_tensor(f.shape, out)
        result.view(-1).copy_(self._wire_view(f.body))
        return result if scale == 1.0 else result.mul_(scale)

    def _wire_view(self, body: memoryview) -> torch.Tensor:
        """The body as a read-only 1-D tensor of ``wire_dtype`` (no copy)."""
        if self.wire_dtype == torch.bfloat16:
            return readonly_tensor(np.frombuffer(body, dtype=np.int16)).view(torch.bfloat16)
        return readonly_tensor(np.frombuffer(body, dtype=_NUMPY_DTYPE[self.wire_dtype]))

    def _scratch(self, role: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A per-thread scratch tensor, reused while the size stays the same."""
        buf = getattr(self._local, role, None)
        if buf is None or buf.numel() != numel:
            buf = torch.empty(numel, dtype=dtype)
            setattr(self._local, role, buf)
        return buf

    def estimate_ratio(self, numel: int) -> float:
        return 4.0 / self.wire_dtype.itemsize

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


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
    lossless = True
    wire_dtype = torch.float32


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
    wire_dtype = torch.float16

    def _cast(self, flat: torch.Tensor, wire: torch.Tensor) -> float:
        wire.copy_(flat)
        if flat.numel() == 0:
            return 1.0
        low, high = torch.aminmax(wire)  # on the half-size output: 1.4x cheaper than input
        peak = max(float(high), -float(low))
        if math.isfinite(peak) and peak >= _FP16_MIN_NORMAL:
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
    wire_dtype = torch.bfloat16

"""Element-wise float codecs: FP32 passthrough, FP16 (overflow-safe) and BF16."""

from __future__ import annotations

import struct

import torch

from skyfed.compression import frame
from skyfed.compression.base import Codec, PayloadError

_FP16_MAX = 65504.0
_SCALE = struct.Struct("<f")


class _ElementwiseCodec(Codec):
    """Casts every element to ``wire_dtype``; subclasses add scaling where needed."""

    wire_dtype: torch.dtype

    def encode(self, x: torch.Tensor) -> bytes:
        x = x.detach().to(torch.float32).contiguous()
        scale = self._scale_for(x)
        wire = (x if scale == 1.0 else x / scale).to(self.wire_dtype)
        body = wire.reshape(-1).view(torch.uint8).numpy().tobytes()
        return frame.pack(self.wire_id, tuple(x.shape), _SCALE.pack(scale), body, zstd=False)

    def decode(self, payload: bytes) -> torch.Tensor:
        f = frame.unpack(payload, max_body=0)
        if f.codec != self.wire_id:
            raise PayloadError(f"payload is codec {f.codec}, not {self.name}")
        if len(f.params) != _SCALE.size:
            raise PayloadError(f"{self.name} payload has {len(f.params)} parameter bytes")
        (scale,) = _SCALE.unpack(f.params)
        itemsize = torch.empty(0, dtype=self.wire_dtype).element_size()
        if len(f.body) != f.numel * itemsize:
            raise PayloadError(
                f"{self.name} body is {len(f.body)} bytes, shape {f.shape} needs "
                f"{f.numel * itemsize}"
            )
        flat = torch.frombuffer(bytearray(f.body), dtype=self.wire_dtype) if f.body else (
            torch.empty(0, dtype=self.wire_dtype)
        )
        out = flat.to(torch.float32).reshape(f.shape)
        return out if scale == 1.0 else out * scale

    def _scale_for(self, x: torch.Tensor) -> float:
        return 1.0

    def estimate_ratio(self, numel: int) -> float:
        return 4.0 / torch.empty(0, dtype=self.wire_dtype).element_size()


class Fp32(_ElementwiseCodec):
    """Lossless passthrough: the reference every other codec is measured against."""

    name = "fp32"
    wire_id = 0
    lossless = True
    wire_dtype = torch.float32


class Fp16(_ElementwiseCodec):
    """IEEE half precision. A tensor whose largest magnitude would overflow FP16 is divided
    by a power-of-two scale first (exact, so no extra rounding); the scale is in the frame.
    """

    name = "fp16"
    wire_id = 1
    wire_dtype = torch.float16

    def _scale_for(self, x: torch.Tensor) -> float:
        if x.numel() == 0:
            return 1.0
        peak = float(x.abs().max())
        if peak <= _FP16_MAX or not torch.isfinite(torch.tensor(peak)):
            return 1.0
        exponent = 0
        while peak / (2.0**exponent) > _FP16_MAX:
            exponent += 1
        return 2.0**exponent


class Bf16(_ElementwiseCodec):
    """bfloat16: FP32's range with 8 bits of mantissa, so it never overflows."""

    name = "bf16"
    wire_id = 2
    wire_dtype = torch.bfloat16

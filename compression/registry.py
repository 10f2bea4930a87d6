"""Codec names on the command line and ids on the wire, in one table."""

from __future__ import annotations

import torch

from skyfed.compression import frame
from skyfed.compression.base import Codec, PayloadError
from skyfed.compression.ecsgd import EcSgd
from skyfed.compression.fp import Bf16, Fp16, Fp32
from skyfed.compression.topk import TopK

_CODECS: dict[str, type[Codec]] = {c.name: c for c in (Fp32, Fp16, Bf16, TopK, EcSgd)}
_BY_WIRE_ID: dict[int, type[Codec]] = {c.wire_id: c for c in _CODECS.values()}
# Decoding reads every parameter from the frame, so one default instance per codec serves.
_DECODERS: dict[int, Codec] = {wire_id: cls() for wire_id, cls in _BY_WIRE_ID.items()}


def codec_names() -> list[str]:
    """Every codec this build can encode and decode."""
    return list(_CODECS)


def make_codec(name: str, **params: object) -> Codec:
    """Build a codec by name; a name this build does not know raises ``ValueError``."""
    try:
        cls = _CODECS[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; known: {', '.join(_CODECS)}") from None
    return cls(**params)


def payload_codec(payload: bytes) -> str:
    """The codec name a payload's frame says encoded it."""
    if len(payload) < 6 or payload[:4] != frame.MAGIC:
        raise PayloadError("payload does not start with the skyfed frame magic")
    try:
        return _BY_WIRE_ID[payload[5]].name
    except KeyError:
        raise PayloadError(f"payload names unknown codec id {payload[5]}") from None


def decode_payload(payload: bytes, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode any payload by the codec its frame names (into ``out`` when given)."""
    payload_codec(payload)
    return _DECODERS[payload[5]].decode(payload, out)

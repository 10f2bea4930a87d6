"""Gradient codecs, their error-feedback state, and the link policy that picks among them."""

from skyfed.compression.base import Capabilities, Codec, Parsed, PayloadError
from skyfed.compression.feedback import ErrorFeedback
from skyfed.compression.registry import (
    capabilities,
    check_payload,
    check_payload_parsed,
    check_pieces_payload,
    codec_names,
    decode_add_payload,
    decode_add_pieces_payload,
    decode_payload,
    keeps_parse,
    make_codec,
    needs_check_scratch,
    payload_codec,
    register,
    rounding_seed,
)

__all__ = [
    "Capabilities",
    "Codec",
    "ErrorFeedback",
    "Parsed",
    "PayloadError",
    "capabilities",
    "check_payload",
    "check_pieces_payload",
    "check_payload_parsed",
    "needs_check_scratch",
    "codec_names",
    "decode_add_payload",
    "decode_add_pieces_payload",
    "decode_payload",
    "keeps_parse",
    "make_codec",
    "payload_codec",
    "register",
    "rounding_seed",
]

"""Codec names on the command line and ids on the wire, in one table: a line per codec."""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Iterator, Sequence

import torch

from skyfed.compression import frame
from skyfed.compression.base import (
    Capabilities,
    Codec,
    Parsed,
    PayloadError,
    dense_check,
    expected_shape,
    overrides,
)
from skyfed.compression.ecsgd import EcSgd
from skyfed.compression.fp import Bf16, Fp16, Fp32
from skyfed.compression.topk import TopK

_CODECS: dict[str, type[Codec]] = {}
# Decoding reads every parameter from the frame, so one default instance per codec serves.
_DECODERS: dict[int, Codec] = {}


def register(cls: type[Codec]) -> type[Codec]:
    """Make ``cls`` a codec this build encodes and decodes, by its ``name`` and its
    ``wire_id``; a name or id taken already, or no :class:`Capabilities`, raises
    ``ValueError``. Returns ``cls``."""
    if not isinstance(getattr(cls, "capabilities", None), Capabilities):
        raise ValueError(f"codec {cls.__name__} declares no Capabilities")
    if cls.name in _CODECS or cls.wire_id in _DECODERS:
        raise ValueError(f"codec {cls.name!r} (wire id {cls.wire_id}) is registered already")
    _CODECS[cls.name] = cls
    _DECODERS[cls.wire_id] = cls()
    return cls


register(Fp32)
register(Fp16)
register(Bf16)
register(TopK)
register(EcSgd)


def codec_names() -> list[str]:
    """Every codec this build can encode and decode."""
    return list(_CODECS)


def make_codec(name: str, *, seed: int | Sequence[int] | None = None, **params: object) -> Codec:
    """Build a codec by name; a name this build does not know raises ``ValueError``.

    ``seed`` seeds a stochastic codec's rounding (:func:`rounding_seed`); deterministic
    codecs take none, so a caller that does not know which codec it builds passes it anyway.
    """
    cls = _codec_class(name)
    if seed is not None and cls.capabilities.stochastic:
        params = {**params, "seed": seed}
    return cls(**params)


def capabilities(name: str) -> Capabilities:
    """What codec ``name`` is (:class:`Capabilities`); an unknown name raises ``ValueError``."""
    return _codec_class(name).capabilities


def rounding_seed(seed: int, sender: str, round_: int, rank: int = 0) -> list[int]:
    """The seed of one sender's stochastic rounding in one round.

    A federation run with a given ``seed`` then rounds the same way every time it is run
    (with its dither drawn from the OS, fixed EC-SGD took 88 and 89 rounds to the same
    loss in two runs of one seed), and rounding stays independent between senders, ranks
    and rounds: senders dithering alike would round their errors alike, and those errors
    would not average out in the mean. Seeding per round rather than per run keeps a
    round's rounding the same whatever codecs the link used before it.
    """
    return [seed % 2**64, zlib.crc32(sender.encode()), rank, round_]


def payload_codec(payload: bytes) -> str:
    """The codec name a payload's frame says encoded it."""
    return _decoder(payload).name


def decode_payload(
    payload: bytes,
    out: torch.Tensor | None = None,
    *,
    shape: tuple[int, ...] | torch.Size | None = None,
) -> torch.Tensor:
    """Decode any payload by the codec its frame names, into ``out`` (the fast path: a
    buffer reused round after round) or a new tensor of ``shape``.

    The expected shape (``out``'s or ``shape``) is required: the frame's claimed shape
    and lengths are checked against it before anything of that size is allocated. The
    form with neither is deprecated (it trusts the frame's shape, within the codecs' own
    bounds) and warns.
    """
    expected = expected_shape(out, shape)
    if expected is None:
        warnings.warn(
            "decode_payload without out= or shape= trusts the frame's claimed shape; "
            "pass the shape the tensor must have",
            DeprecationWarning,
            stacklevel=2,
        )
    return _decoder(payload).decode(payload, out, shape=expected)


def decode_add_payload(payload: bytes, acc: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """``acc += alpha * D(payload)`` by the codec its frame names (:meth:`Codec.decode_add`):
    the frame must have ``acc``'s shape; ``acc`` (float32 or float64, a shard's view is
    fine) is returned."""
    return _decoder(payload).decode_add(payload, acc, alpha)


def decode_add_pieces_payload(
    payload: bytes, acc: torch.Tensor, alpha: float = 1.0
) -> Iterator[None] | None:
    """:meth:`Codec.decode_add_pieces` by the codec its frame names: ``acc += alpha *
    D(payload)`` one piece of ``pieces(acc)`` per ``next``, or None where that codec
    adds only whole (then :func:`decode_add_payload`)."""
    return _decoder(payload).decode_add_pieces(payload, acc, alpha)


def check_payload(
    payload: bytes,
    out: torch.Tensor | None = None,
    *,
    shape: tuple[int, ...] | torch.Size | None = None,
) -> float:
    """The payload checked as a receiver must before counting it, by the codec the frame
    names, and the squared L2 norm of what it decodes to (:meth:`Codec.check_parsed`'s,
    its parse dropped). ``out`` or ``shape`` is required (``out``: the scratch a dense
    codec decodes into)."""
    expected = expected_shape(out, shape)
    if expected is None:
        raise ValueError("check_payload needs the expected shape: out= or shape=")
    return _decoder(payload).check_parsed(payload, out, shape=expected)[0]


def check_payload_parsed(
    payload: bytes,
    out: torch.Tensor | None = None,
    *,
    shape: tuple[int, ...] | torch.Size | None = None,
) -> tuple[float, Parsed | None]:
    """:func:`check_payload`, and the parse kept for a later sum (:meth:`Codec.check_parsed`:
    Top-k's indices and values; None for the codecs that keep nothing)."""
    expected = expected_shape(out, shape)
    if expected is None:
        raise ValueError("check_payload_parsed needs the expected shape: out= or shape=")
    return _decoder(payload).check_parsed(payload, out, shape=expected)


def check_pieces_payload(payload: bytes, *, shape: tuple[int, ...] | torch.Size) -> Iterator[float]:
    """:meth:`Codec.check_pieces` by the codec the frame names: :func:`check_payload` a
    piece at a time, for a payload that needs no scratch (:func:`needs_check_scratch`)."""
    return _decoder(payload).check_pieces(payload, shape=tuple(shape))


def keeps_parse(name: str) -> bool:
    """Whether codec ``name``'s check keeps its parse for a later sum (it has its own
    :meth:`Codec.check_parsed`); an unknown name raises ``ValueError``."""
    return overrides(_codec_class(name), "check_parsed")


def needs_check_scratch(payload: bytes) -> bool:
    """Whether :func:`check_payload` needs ``out`` for this payload's codec (a dense
    decode into a tensor-sized scratch), or only its shape (:func:`~skyfed.compression.base.dense_check`)."""
    return dense_check(_decoder(payload))


def _codec_class(name: str) -> type[Codec]:
    try:
        return _CODECS[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; known: {', '.join(_CODECS)}") from None


def _decoder(payload: bytes) -> Codec:
    wire_id = frame.codec_id(payload)
    try:
        return _DECODERS[wire_id]
    except KeyError:
        raise PayloadError(f"payload names unknown codec id {wire_id}") from None

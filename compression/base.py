"""The codec interface: one tensor in, one self-describing payload out, and back."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch


class PayloadError(ValueError):
    """A payload that is truncated, corrupted, foreign or inconsistent with its header."""


class Codec(ABC):
    """Turns a float32 tensor into a framed payload and back.

    Codecs are stateless apart from their parameters; error-feedback residuals live in an
    :class:`~skyfed.compression.feedback.ErrorFeedback` object the caller owns, so the
    same residual survives a change of codec on a link.
    """

    name: ClassVar[str]
    wire_id: ClassVar[int]
    lossless: ClassVar[bool] = False
    # Sends only some coordinates of a (large) tensor; the rest wait in the residual.
    sparse: ClassVar[bool] = False
    # Sends every element of its input up to rounding, so it would send a whole residual at
    # once: error feedback gives it at most the update's norm of it per round
    # (:func:`~skyfed.compression.feedback.released`).
    bounded_release: ClassVar[bool] = False
    # Rounds at random: takes a ``seed`` for its rounding (:func:`make_codec`'s ``seed``).
    stochastic: ClassVar[bool] = False

    @abstractmethod
    def encode(self, x: torch.Tensor) -> bytes:
        """Encode ``x`` (float32, any shape) into a framed payload."""

    @abstractmethod
    def decode(self, payload: bytes, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decode a payload made by :meth:`encode` into a float32 tensor of its shape.

        Everything needed to decode is in the payload, never in this object's parameters.
        ``out``, when given, is a float32 contiguous tensor the result is written into (and
        returned); its shape is the shape the caller expects. Raises :class:`PayloadError`
        for anything that is not such a payload, or that does not have ``out``'s shape.
        """

    def encode_with_feedback(
        self, g: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[bytes, torch.Tensor]:
        """Error feedback: ``p = g + e; c = C(p); e' = p - D(c)``. Returns ``(c, e')``.

        Codecs override this when they can form ``e'`` cheaper than a full decode.
        """
        p = g if residual is None else g + residual
        payload = self.encode(p)
        return payload, p - self.decode(payload)

    def estimate_ratio(self, numel: int) -> float:
        """Raw float32 bytes over payload bytes, estimated without encoding."""
        return 1.0

    def plan(self, pending: dict[str, torch.Tensor]) -> dict[str, Codec]:
        """The codec for each of a set of tensors that travel together (one contribution,
        one broadcast). This codec for every one, unless the codec plans across them."""
        return dict.fromkeys(pending, self)

    def for_downlink(self, senders: int) -> Codec:
        """The codec that sends the mean of ``senders`` uplinks of this codec back.

        The same codec for every codec whose payload size does not depend on its input.
        """
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def output_tensor(shape: tuple[int, ...], out: torch.Tensor | None) -> torch.Tensor:
    """The tensor a decoder writes into: ``out`` after checking it, else a new one."""
    if out is None:
        return torch.empty(shape, dtype=torch.float32)
    if out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 tensor, not {out.dtype}")
    if tuple(out.shape) != shape:
        raise PayloadError(f"payload has shape {shape}, expected {tuple(out.shape)}")
    return out


def as_flat_f32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a contiguous 1-D float32 tensor, without a copy where it already is one."""
    return x.detach().to(torch.float32).contiguous().reshape(-1)

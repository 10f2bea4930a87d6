"""Error-feedback residuals: what a lossy codec did not send yet, kept per tensor shard,
and the one encoder that keeps them (every sender's: the agents' uplinks, the
coordinator's downlink).

``p = g + e; c = C(p); e = p - D(c)``, worked in the residual's own memory, tensor by
tensor, with at most one tensor-sized temporary (docs/scale.md): codecs whose input is
sent element by element (FP16/BF16/FP32) fuse ``p = g + e`` and ``e' = p - D(c)`` into
``e``'s memory (``Codec.encode_with_feedback(g, e)``) one tensor at a time, so payloads
can leave while later tensors are encoded; the others get every ``p`` planned together
(Top-k's one threshold) before the first is encoded: summed by the codec's own
``encode_with_feedback`` where it has one and ``g`` stays the caller's, else built in its
residual's memory and ``e'`` written over it (``Codec.encode_into_residual``). What was
sent stays encoded: decode the payload if it must be credited back.

A codec that sends all of its input (``Capabilities.sends_all``: FP16/BF16/FP32) takes
at most ``|g|`` of the residual per round (L2, per tensor): after a Top-k phase the
residual holds many rounds of delayed updates, and a link that switched to FP16 sent them
in one step and spiked the loss (2.51 -> 2.85 held-out, ``bench/adaptive.py``, gradient
exchange). Held work is delayed, not lost. A residual no larger than ``g`` (FP16's own
rounding error) goes whole; a tensor whose update is exactly zero holds its residual until
it moves again.

Payloads are ``memoryview``s into new memory per encode (:meth:`ErrorFeedback.buffer`),
which lives as long as the payload does: kept per key from round to round it held half
the model at each end with FP16; numpy's fresh memory (huge pages) costs 8-13 % of the
encode (docs/scale.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import torch

from skyfed.compression.base import Codec, overrides
from skyfed.compression.frame import PayloadBuffer
from skyfed.compression.norms import squared_norm


def release_share(g: torch.Tensor, residual: torch.Tensor) -> float | None:
    """``|g| / |e|`` (L2) where the residual is the larger, else None (it goes whole):
    the share of the residual a bounded-release codec sends with ``g``."""
    g_sq, e_sq = squared_norm(g), squared_norm(residual)
    if e_sq <= g_sq:
        return None
    return math.sqrt(g_sq / e_sq)


@dataclass
class ErrorFeedback:
    """Residuals keyed by tensor (or shard) name, owned by one end of one link.

    The invariant over any run of rounds: sum of what was sent (decoded) plus the current
    residual equals the sum of what was fed in, to float tolerance. A residual is a plain
    float32 tensor, so it carries over when the link switches codec.
    """

    residuals: dict[str, torch.Tensor] = field(default_factory=dict)
    memory: Callable[[int], memoryview] | None = None
    """Where payload memory comes from (``PayloadBuffer``'s ``memory``): the coordinator's
    pool, which keeps it mapped between rounds; None: new numpy memory per encode."""

    def encode(
        self,
        codec: Codec,
        tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        borrowed: bool = False,
        applied_to: Mapping[str, torch.Tensor] | None = None,
        alpha: float = 1.0,
    ) -> Iterator[tuple[str, bytes]]:
        """``(key, payload)`` for each ``(key, g)`` of ``tensors`` (in their order), the
        residuals updated. Each ``g`` is only read; a residual's memory is reused for
        ``p`` and ``e'``. Lazy: each payload is encoded when it is asked for, and
        ``tensors`` is read as it is needed, so it may be a generator; exhaust it (every
        residual is then updated). A ``g`` with no residual yet is copied (``e'`` is
        written over ``p``), so ``borrowed`` (each ``g``'s memory is reused for the next
        one) needs nothing more and is accepted for callers that say it. With
        ``applied_to``, each payload is also added decoded, ``alpha`` times, into that
        key's tensor (:meth:`Codec.encode_into_residual_applied`: the sender's own apply,
        from what the encoder has in hand) before it is yielded."""
        if codec.capabilities.sends_all and not overrides(codec, "plan"):
            for key, g in tensors:
                payload = self._bounded(codec, key, g)
                if applied_to is not None:
                    codec.decode_add(payload, applied_to[key], alpha)
                yield key, payload
            return
        residuals = self.residuals
        # A codec with its own error feedback sums p = e + g in its own first pass (Top-k's
        # selection, EC-SGD's runs of blocks): it gets e and g apart, when each g stays the
        # caller's until its payload is made (not borrowed).
        fuse = overrides(codec, "encode_with_feedback") and not borrowed and applied_to is None
        pending: dict[str, torch.Tensor] = {}
        adds: dict[str, torch.Tensor] = {}
        for key, g in tensors:
            e = residuals.get(key)
            if e is None:  # e' will be written over p: never over the caller's g
                pending[key] = torch.empty(g.shape).copy_(g)
            elif fuse and _summable(e, g):
                pending[key], adds[key] = e, g
            else:
                pending[key] = e.add_(g)  # p = e + g, in the residual's memory
        for key, each in codec.plan(pending, adds or None).items():
            p = pending.pop(key)
            if key in adds:  # p = e + g and e' both in e's memory, in the codec's passes
                g = adds.pop(key)
                payload, residuals[key] = each.encode_with_feedback(g, p, out=self.buffer(key))
                yield key, payload
                continue
            if applied_to is None:
                payload = each.encode_into_residual(p, out=self.buffer(key))  # e' in p
            else:
                acc = applied_to[key]
                payload = each.encode_into_residual_applied(p, acc, alpha, out=self.buffer(key))
            residuals[key] = p
            yield key, payload

    def _bounded(self, codec: Codec, key: str, g: torch.Tensor) -> bytes:
        """One tensor of a codec that sends all of its input: at most ``|g|`` of the
        residual goes with it (see the module docstring), the rest is held."""
        e = self.residuals.get(key)
        held = None
        if e is not None:
            share = release_share(g, e)
            if share is not None:
                held = e * (1.0 - share)
                e.mul_(share)
        payload, residual = codec.encode_with_feedback(g, e, out=self.buffer(key))
        self.residuals[key] = residual if held is None else residual.add_(held)
        return payload

    def buffer(self, key: str) -> PayloadBuffer:
        """The key's payload memory for its next encode: new memory each time (from
        ``memory`` where it is set), so a payload's memory lives exactly as long as the
        payload (an unacknowledged upload, a broadcast's encode) and nothing payload-sized
        is held between rounds: kept per key, it held half the model at each end with
        FP16, through an agent's local steps' peak. New memory costs its first touch:
        8-13 % of an FP16 encode right after a free, several times that once the freed
        pages sat a few seconds (docs/scale.md), hence the coordinator's pool."""
        return PayloadBuffer(self.memory)

    def credit(self, key: str, x: torch.Tensor) -> None:
        """Add ``x`` to the key's residual: unsent work that goes out with a later payload."""
        previous = self.residuals.get(key)
        self.residuals[key] = x if previous is None else previous + x


def _summable(e: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether ``e += g`` can be left to the codec's pass: both contiguous float32 of one
    shape (the codec then writes ``e'`` in ``e``'s own memory)."""
    return (
        e.shape == g.shape
        and e.dtype == g.dtype == torch.float32
        and e.is_contiguous()
        and g.is_contiguous()
    )

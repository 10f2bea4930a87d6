"""Error-feedback encoding in the residual's own memory, tensor by tensor (docs/scale.md).

:meth:`ErrorFeedback.encode_all <skyfed.compression.feedback.ErrorFeedback.encode_all>`
forms every ``p = g + e`` up front, then a fresh ``e'`` and a decoded ``sent`` per tensor:
three model-sized temporaries. This gives the same payloads and residuals, bit for bit,
with at most one tensor-sized temporary: codecs whose input is sent element by element
(FP16/BF16/FP32) fuse ``p = g + e`` and ``e' = p - D(c)`` into ``e``'s memory
(``Codec.encode_with_feedback(g, e)``) one tensor at a time, so payloads can leave while
later tensors are encoded; codecs that plan across the set (Top-k's one threshold) get
every ``p`` built in its residual's memory first, and ``e'`` written over it
(``Codec.encode_into_residual``). What was sent stays encoded: decode the payload if it
must be credited back.

Payloads are ``memoryview``s into new numpy memory per encode (``ErrorFeedback.buffer``),
which lives as long as the payload does: kept per key from round to round it held half
the model at each end with FP16; numpy's fresh memory (huge pages) costs 8-13 % of the
encode (docs/scale.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import torch

from skyfed.compression.base import Codec
from skyfed.compression.feedback import ErrorFeedback, release_share


def encode_in_place(
    feedback: ErrorFeedback,
    codec: Codec,
    tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    borrowed: bool = False,
    applied_to: Mapping[str, torch.Tensor] | None = None,
    alpha: float = 1.0,
) -> Iterator[tuple[str, bytes]]:
    """``(key, payload)`` for each ``(key, g)`` of ``tensors`` (in their order), updating
    ``feedback``'s residuals as ``encode_all`` does. Each ``g`` is only read; a residual's
    memory is reused for ``p`` and ``e'``. Lazy: each payload is encoded when it is asked
    for, and ``tensors`` is read as it is needed, so it may be a generator. A ``g`` with no
    residual yet is copied (``e'`` is written over ``p``), so ``borrowed`` (each ``g``'s
    memory is reused for the next one) needs nothing more and is accepted for callers
    that say it. With ``applied_to``, each payload is also added decoded, ``alpha`` times,
    into that key's tensor (:meth:`Codec.encode_into_residual_applied`: the sender's own
    apply, from what the encoder has in hand) before it is yielded."""
    if codec.bounded_release and type(codec).plan is Codec.plan:
        for key, g in tensors:
            payload = _bounded(feedback, codec, key, g)
            if applied_to is not None:
                codec.decode_add(payload, applied_to[key], alpha)
            yield key, payload
        return
    residuals = feedback.residuals
    # A codec that sums p = e + g in its selection's first pass gets e and g apart, when
    # each g stays the caller's until its payload is made (not borrowed).
    fuse = codec.sums_in_encode and not borrowed and applied_to is None
    pending, adds = {}, {}
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
        g = adds.pop(key, None)
        if g is not None:  # p = e + g and e' both in e's memory, in the codec's passes
            payload, residuals[key] = each.encode_with_feedback(g, p, out=feedback.buffer(key))
            yield key, payload
            continue
        if applied_to is None:
            payload = each.encode_into_residual(p, out=feedback.buffer(key))  # e' in p
        else:
            acc = applied_to[key]
            payload = each.encode_into_residual_applied(p, acc, alpha, out=feedback.buffer(key))
        residuals[key] = p
        yield key, payload


def _summable(e: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether ``e += g`` can be left to the codec's pass: both contiguous float32 of one
    shape (the codec then writes ``e'`` in ``e``'s own memory)."""
    return (
        e.shape == g.shape
        and e.dtype == g.dtype == torch.float32
        and e.is_contiguous()
        and g.is_contiguous()
    )


def _bounded(feedback: ErrorFeedback, codec: Codec, key: str, g: torch.Tensor) -> bytes:
    """One tensor of a codec that sends all of its input: at most ``|g|`` of the residual
    goes with it (:func:`~skyfed.compression.feedback.released`), the rest is held."""
    e = feedback.residuals.get(key)
    held = None
    if e is not None:
        share = release_share(g, e)
        if share is not None:
            held = e * (1.0 - share)
            e.mul_(share)
    payload, residual = codec.encode_with_feedback(g, e, out=feedback.buffer(key))
    feedback.residuals[key] = residual if held is None else residual.add_(held)
    return payload

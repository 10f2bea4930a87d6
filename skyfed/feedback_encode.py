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

import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait

import torch

from skyfed.compression.base import Codec
from skyfed.compression.feedback import ErrorFeedback, release_share
from skyfed.compression.frame import PayloadBuffer


def encode_in_place(
    feedback: ErrorFeedback,
    codec: Codec,
    tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    borrowed: bool = False,
    applied_to: Mapping[str, torch.Tensor] | None = None,
    alpha: float = 1.0,
    workers: int = 1,
) -> Iterator[tuple[str, bytes]]:
    """``(key, payload)`` for each ``(key, g)`` of ``tensors`` (in their order), updating
    ``feedback``'s residuals as ``encode_all`` does. Each ``g`` is only read; a residual's
    memory is reused for ``p`` and ``e'``. Lazy: each payload is encoded when it is asked
    for, and ``tensors`` is read as it is needed, so it may be a generator. A ``g`` with no
    residual yet is copied (``e'`` is written over ``p``), so ``borrowed`` (each ``g``'s
    memory is reused for the next one) needs nothing more and is accepted for callers
    that say it. With ``applied_to``, each payload is also added decoded, ``alpha`` times,
    into that key's tensor (:meth:`Codec.encode_into_residual_applied`: the sender's own
    apply, from what the encoder has in hand) before it is yielded. ``workers`` > 1: a
    planning codec's keys (given summed, not fused) are encoded that many at once on a
    pool, the same bytes in the same order (:func:`_planned_on_workers`); a stochastic
    codec (EC-SGD: one generator drawn from key after key) stays one key at a time."""
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
    plan = codec.plan(pending, adds or None)
    if workers > 1 and not adds and len(plan) > 1 and not codec.stochastic:
        yield from _planned_on_workers(feedback, plan, pending, workers, applied_to, alpha)
        return
    for key, each in plan.items():
        p = pending.pop(key)
        g = adds.pop(key, None)
        if g is not None:  # p = e + g and e' both in e's memory, in the codec's passes
            payload, residuals[key] = each.encode_with_feedback(g, p, out=feedback.buffer(key))
            yield key, payload
            continue
        payload = _encode_planned(each, p, feedback.buffer(key), applied_to, key, alpha)
        residuals[key] = p
        yield key, payload


def _encode_planned(
    each: Codec,
    p: torch.Tensor,
    out: PayloadBuffer,
    applied_to: Mapping[str, torch.Tensor] | None,
    key: str,
    alpha: float,
) -> bytes:
    """One planned key's payload, ``e'`` left in ``p`` (and its apply, with ``applied_to``)."""
    if applied_to is None:
        return each.encode_into_residual(p, out=out)  # e' in p
    return each.encode_into_residual_applied(p, applied_to[key], alpha, out=out)


def _planned_on_workers(
    feedback: ErrorFeedback,
    plan: dict[str, Codec],
    pending: dict[str, torch.Tensor],
    workers: int,
    applied_to: Mapping[str, torch.Tensor] | None,
    alpha: float,
) -> Iterator[tuple[str, bytes]]:
    """The planned keys encoded up to ``workers`` at once, yielded in the plan's order.

    Each key's encode reads and writes only its own ``p``, payload buffer and applied
    tensor, and a codec's scratch is per thread (``base.SCRATCH``), so each payload,
    residual and applied tensor is bit for bit the one-at-a-time encode's; residuals are
    stored on the caller's thread in the plan's order. Torch and numpy release the GIL in
    the selection's passes, so with one intra-op thread (the coordinator's) two keys use
    two cores where one key used one. A key that fails (a non-finite payload) raises once
    the keys already started are done; those may have been applied.
    """
    residuals = feedback.residuals
    keys = list(plan)
    jobs: dict[str, Future[bytes]] = {}
    pool = _encode_pool(workers)

    def start(key: str) -> None:
        out = feedback.buffer(key)
        jobs[key] = pool.submit(
            _encode_planned, plan[key], pending[key], out, applied_to, key, alpha
        )

    try:
        for key in keys[:workers]:
            start(key)
        for at, key in enumerate(keys):
            payload = jobs.pop(key).result()
            residuals[key] = pending.pop(key)
            if at + workers < len(keys):
                start(keys[at + workers])
            yield key, payload
    finally:  # nothing of this call still writes once it has returned or raised
        for job in jobs.values():
            job.cancel()
        wait(list(jobs.values()))


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _encode_pool(workers: int) -> ThreadPoolExecutor:
    """The shared pool the planned keys are encoded on (grown, never shrunk)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < workers:
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="skyfed-encode")
        return _pool


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

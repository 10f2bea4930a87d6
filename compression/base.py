"""The codec interface: one tensor in, one self-describing payload out, and back.

A codec is ``encode`` and ``decode`` and a :class:`Capabilities` that says what it is; a
new one is a file with its class and a line in ``compression/registry.py``
(docs/add-a-codec.md). Every other method of :class:`Codec` is a fast path with a correct
default built on those two: a codec overrides one only for speed, and its result stays
bit for bit the default's (docs/codecs-performance.md). Which fast paths a codec has is
read from what it overrides (:func:`overrides`), so no flag can disagree with the code.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch

from skyfed.compression.norms import all_finite, squared_norm

if TYPE_CHECKING:
    from skyfed.compression.frame import PayloadBuffer


class PayloadError(ValueError):
    """A payload that is truncated, corrupted, foreign or inconsistent with its header."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What a codec is, as data: the policy, error feedback, the downlink, an agent's
    momentum and the run report read this, never a table of codec names."""

    heaviness: int
    """Its place among the codecs, lightest compression first (fp32 0, bf16 10, fp16 20,
    topk 30, ecsgd 40: a new codec takes a number between its neighbours). The policy's
    ladder follows it where no measured ratio orders two codecs, and the downlink sends
    the heaviest codec of its round's links."""
    lossless: bool = False
    """``D(C(x)) == x``: a downlink of it holds no residual once the backlog is out."""
    sends_all: bool = False
    """Sends every element of its input up to rounding, so it would send a whole residual
    at once: error feedback gives it at most the update's norm of it per round
    (:func:`~skyfed.compression.feedback.release_share`)."""
    sparse: bool = False
    """Sends only some coordinates of a tensor, the rest waiting in the residual: under
    gradient exchange an agent restarts its momentum where something was sent."""
    stochastic: bool = False
    """Rounds at random: takes a ``seed`` for its rounding
    (:func:`~skyfed.compression.registry.make_codec`'s ``seed``)."""
    color: str = "black"
    """Its colour in the run report's plots (a matplotlib colour)."""


class Codec(ABC):
    """Turns a float32 tensor into a framed payload and back.

    Codecs are stateless apart from their parameters; error-feedback residuals live in an
    :class:`~skyfed.compression.feedback.ErrorFeedback` object the caller owns, so the
    same residual survives a change of codec on a link.
    """

    name: ClassVar[str]
    """What ``--codec``, the policy and every chunk call it."""
    wire_id: ClassVar[int]
    """The byte its frames carry (``frame.header``); unique among the registered codecs."""
    capabilities: ClassVar[Capabilities]

    @abstractmethod
    def encode(self, x: torch.Tensor, out: PayloadBuffer | None = None) -> bytes:
        """Encode ``x`` (float32, any shape) into a framed payload: ``bytes``, or a
        ``memoryview`` into ``out`` (memory the caller reuses round after round; a codec
        may ignore it)."""

    @abstractmethod
    def decode(
        self,
        payload: bytes,
        out: torch.Tensor | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        """Decode a payload made by :meth:`encode` into a float32 tensor of its shape.

        Everything needed to decode is in the payload, never in this object's parameters.
        The caller says the shape it expects: ``out``'s (a float32 contiguous tensor the
        result is written into and returned: the fast path, no fresh memory) or ``shape``.
        The frame's claimed shape and every length in it are checked against that shape
        before anything of its size is allocated (docs/codecs-performance.md). Raises
        :class:`PayloadError` for anything that is not such a payload of that shape.
        """

    # The fast paths: each default is correct for any codec; override for speed only.

    def decode_add(self, payload: bytes, acc: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        """``acc += alpha * D(payload)`` in place, and return ``acc``.

        ``acc`` is float32 or float64, of the payload's shape, and may be a strided view
        (a shard narrowed out of a larger tensor). The result is bit-for-bit
        ``acc.add_(self.decode(payload, shape=acc.shape), alpha=alpha)``; codecs override
        this (or :meth:`decode_add_pieces`) to avoid the full-size decoded temporary
        (Top-k touches only its kept elements, dense codecs decode block by block).
        """
        steps = self.decode_add_pieces(payload, acc, alpha)
        if steps is not None:
            for _ in steps:
                pass
            return acc
        check_accumulator(acc)
        return acc.add_(self.decode(payload, shape=tuple(acc.shape)), alpha=alpha)

    def decode_add_pieces(
        self, payload: bytes, acc: torch.Tensor, alpha: float = 1.0
    ) -> Iterator[None] | None:
        """:meth:`decode_add` one piece of :func:`pieces` ``(acc)`` at a time: each
        ``next`` adds the next piece and the sum is the same bit for bit; None where the
        codec does not add piece by piece (it scatters, or decodes across the tensor).

        So a sum of several payloads can take every term of one piece while the piece is
        in cache, not each term over the whole tensor in turn (the coordinator's mean,
        docs/scale.md). The payload's frame is checked now, before the first ``next``."""
        return None

    def check_parsed(
        self,
        payload: bytes,
        out: torch.Tensor | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> tuple[float, Parsed | None]:
        """Check a payload as a receiver must before counting it (the frame against the
        expected shape, as :meth:`decode` does, and every decoded value finite) and return
        the decoded tensor's squared L2 norm (:func:`~skyfed.compression.norms.squared_norm`),
        with the parse the check made where keeping it pays: a sum that adds the payload
        later (the coordinator's mean at the round's close) then adds from it instead of
        parsing the payload a second time.

        ``out``/``shape`` as for :meth:`decode`; ``out`` is the scratch the default decodes
        into. Raises :class:`PayloadError` for a payload that does not decode or holds NaN
        or Inf. The default keeps nothing (None: :meth:`decode_add` the payload); override
        it to keep a parse (Top-k keeps its ``k`` indices and values, 8 bytes a kept
        element; a dense codec's parse is the tensor itself, so it keeps nothing).
        """
        squares = 0.0
        for piece in self.check_pieces(payload, out, shape=shape):
            squares += piece
        return squares, None

    def check_pieces(
        self,
        payload: bytes,
        out: torch.Tensor | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> Iterator[float]:
        """:meth:`check_parsed`'s check a piece of the payload at a time: each ``next``
        checks the next piece and gives its squared norm, their sum (in order) being the
        check's. So a receiver reading a payload through a file's map can let each
        piece's pages go before the next (the coordinator's staged uplinks,
        docs/scale.md). The default is one piece: the payload decoded whole into ``out``
        (a codec that overrides neither check borrows that tensor-sized scratch from its
        receiver: :func:`dense_check`)."""
        values = self.decode(payload, out, shape=shape)
        if not all_finite(values):
            raise PayloadError("payload holds NaN or Inf values")
        yield squared_norm(values)

    def encode_with_feedback(
        self,
        g: torch.Tensor,
        residual: torch.Tensor | None,
        out: PayloadBuffer | None = None,
    ) -> tuple[bytes, torch.Tensor]:
        """Error feedback: ``p = g + e; c = C(p); e' = p - D(c)``. Returns ``(c, e')``.

        ``e'`` may be written into ``residual``'s memory (the caller replaces its residual
        by ``e'``; it never shares memory with ``g``). ``out`` as for :meth:`encode`.
        Codecs override this when they can form ``e'`` cheaper than a full decode; one
        that does is handed ``g`` and ``e`` apart by error feedback where it can (its own
        pass sums ``p = e + g`` in ``e``'s memory, bit for bit ``e.add_(g)``), and its
        :meth:`plan` then takes the addends unsummed.
        """
        p = g if residual is None else g + residual
        payload = self.encode(p, out=out)
        return payload, p - self.decode(payload, shape=tuple(p.shape))

    def encode_into_residual(self, p: torch.Tensor, out: PayloadBuffer | None = None) -> bytes:
        """Error feedback where the caller has already summed ``p = g + e`` in its
        residual's memory: encode ``p`` and leave ``e' = p - D(c)`` in ``p`` itself.

        Payload and ``e'`` are bit for bit those of ``encode_with_feedback(p, None)``,
        without its fresh ``e'`` (for a 64 MB tensor, fresh memory costs more than the
        encode: docs/codecs-performance.md). ``p`` is a float32 tensor; codecs override
        this where they can write ``e'`` in place.
        """
        payload, residual = self.encode_with_feedback(p, None, out=out)
        p.copy_(residual.view(p.shape))
        return payload

    def encode_into_residual_applied(
        self,
        p: torch.Tensor,
        acc: torch.Tensor,
        alpha: float = 1.0,
        out: PayloadBuffer | None = None,
    ) -> bytes:
        """:meth:`encode_into_residual`, and ``acc += alpha * D(c)``: the sender's own
        apply of what it sends (the coordinator's weights take its broadcast), bit for bit
        :meth:`decode_add` of the payload. Codecs that hold ``D(c)`` once encoded override
        this to skip parsing the payload they just made."""
        payload = self.encode_into_residual(p, out)
        self.decode_add(payload, acc, alpha)
        return payload

    def plan(
        self, pending: dict[str, torch.Tensor], add: dict[str, torch.Tensor] | None = None
    ) -> dict[str, Codec]:
        """The codec for each of a set of tensors that travel together (one contribution,
        one broadcast). This codec for every one, unless the codec plans across them.
        ``add``: tensors not summed yet, for a codec with its own
        :meth:`encode_with_feedback` (each ``p`` is ``pending[key] + add[key]`` where the
        key is there)."""
        return dict.fromkeys(pending, self)

    def for_downlink(self, senders: int) -> Codec:
        """The codec that sends the mean of ``senders`` uplinks of this codec back.

        The same codec for every codec whose payload size does not depend on its input.
        """
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def overrides(codec: type[Codec] | Codec, method: str) -> bool:
    """Whether ``codec`` has its own ``method``, not :class:`Codec`'s default: what its
    fast paths are (error feedback hands ``g`` and ``e`` apart to an own
    ``encode_with_feedback``; an own ``check_parsed`` keeps a parse; a codec with neither
    check of its own decodes densely to check)."""
    cls = codec if isinstance(codec, type) else type(codec)
    return getattr(cls, method) is not getattr(Codec, method)


def dense_check(codec: type[Codec] | Codec) -> bool:
    """Whether ``codec``'s check decodes into a tensor-sized ``out`` (the default
    :meth:`Codec.check_pieces`), which a receiver lends it; False: it checks block by
    block, or only the values sent, and needs only the shape."""
    return not (overrides(codec, "check_pieces") or overrides(codec, "check_parsed"))


# Elements per block where a decoder works block by block (decode_add, fused encodes):
# 1 MiB of float32: the block and its temporaries stay in a 2 MiB L2 (measured fastest of
# 64K, 256K, 1M and 4M elements on the 2-core development host; docs/codecs-performance.md).
BLOCK_NUMEL = 1 << 18


def expected_shape(
    out: torch.Tensor | None, shape: tuple[int, ...] | torch.Size | None
) -> tuple[int, ...] | None:
    """The shape a decoder must find in the frame: ``out``'s, else ``shape`` (None: the
    caller did not say; only :func:`~skyfed.compression.registry.decode_payload`'s
    deprecated form allows it)."""
    if out is not None:
        if out.dtype != torch.float32 or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous float32 tensor, not {out.dtype}")
        if shape is not None and tuple(shape) != tuple(out.shape):
            raise ValueError(f"shape {tuple(shape)} disagrees with out's {tuple(out.shape)}")
        return tuple(out.shape)
    return None if shape is None else tuple(int(d) for d in shape)


def check_shape(claimed: tuple[int, ...], expected: tuple[int, ...] | None) -> None:
    """Refuse a frame whose claimed shape is not the expected one (before allocating)."""
    if expected is not None and claimed != expected:
        raise PayloadError(f"payload has shape {claimed}, expected {expected}")


def output_tensor(shape: tuple[int, ...], out: torch.Tensor | None) -> torch.Tensor:
    """The tensor a decoder writes into: ``out`` (already checked), else a new one."""
    if out is None:
        return torch.empty(shape, dtype=torch.float32)
    check_shape(shape, tuple(out.shape))
    return out


class Parsed(ABC):
    """A payload as its check parsed it (:meth:`Codec.check_parsed`), held until it is
    added: the parse is what a Top-k sum costs most (its indices' zstd and bitmap or
    varints, its values' dequantize), and the check on arrival has made it already."""

    @abstractmethod
    def add_into(self, acc: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        """Bit for bit :meth:`Codec.decode_add` of the payload it was parsed from; ``acc``
        as there (of the payload's shape, float32 or float64, a strided view is fine)."""


def check_accumulator(acc: torch.Tensor) -> None:
    """``decode_add``'s target: float32 or float64 (a strided view is fine)."""
    if acc.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"decode_add accumulates into float32 or float64, not {acc.dtype}")


class Scratch:
    """Per-thread tensors reused across calls and codec instances, by role.

    Fresh memory costs a page fault per 4 KiB on first touch: for a 64 MB tensor more
    than the arithmetic on it. Codecs are built anew each round (the policy's parameters
    change), so their scratch lives here, one set per thread, grown and never shrunk.
    A tensor taken is valid until the same thread takes the same role again.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def take(self, role: str, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The first ``numel`` elements of this thread's ``role`` buffer (1-D)."""
        buffers: dict[Any, torch.Tensor] = self._local.__dict__
        buf = buffers.get((role, dtype))
        if buf is None or buf.numel() < numel:
            buf = buffers[(role, dtype)] = torch.empty(numel, dtype=dtype)
        return buf[:numel]


SCRATCH = Scratch()


_T = TypeVar("_T")
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def spans(numel: int, block: int = BLOCK_NUMEL) -> list[tuple[int, int]]:
    """``[lo, hi)`` spans of whole ``block``s covering ``numel`` elements, one per thread
    torch computes with (``torch.get_num_threads()``), for :func:`in_parallel`."""
    parts = max(1, min(torch.get_num_threads(), -(-numel // block)))
    per = -(-numel // block // parts) * block if numel > block else numel
    return [(lo, min(numel, lo + per)) for lo in range(0, numel, max(per, 1))][:parts] or [(0, 0)]


def in_parallel(fn: Callable[[int, int], _T], span_list: list[tuple[int, int]]) -> list[_T]:
    """``[fn(lo, hi) for (lo, hi) in span_list]``, the first on this thread and the rest on
    a shared pool: for numpy work on large tensors, which releases the GIL but runs on one
    core (torch's own kernels already split themselves; two Python threads each calling
    them contend for torch's pool: docs/codecs-performance.md)."""
    if len(span_list) == 1:
        return [fn(*span_list[0])]
    pool = _shared_pool(len(span_list) - 1)
    futures = [pool.submit(fn, lo, hi) for lo, hi in span_list[1:]]
    first = fn(*span_list[0])
    return [first, *(f.result() for f in futures)]


def beside(background: Callable[[], object], here: Callable[[], _T]) -> _T:
    """``here()`` on this thread while ``background()`` runs on the shared pool, for two
    independent pieces of GIL-releasing work (one memory-bound, one not: they overlap);
    returns ``here()``'s result once both are done, raising what either raised.
    ``background`` must not use :func:`in_parallel`, whose pool it occupies."""
    if torch.get_num_threads() < 2:
        background()
        return here()
    future = _shared_pool(torch.get_num_threads() - 1).submit(background)
    try:
        result = here()
    except BaseException:
        wait([future])  # it writes the caller's memory: never left running
        raise
    future.result()
    return result


def _shared_pool(workers: int) -> ThreadPoolExecutor:
    """The codecs' one pool of worker threads (created on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="skyfed-codec")
        return _pool


def blocks(numel: int, block: int = BLOCK_NUMEL) -> range:
    """Start offsets of ``block``-element pieces covering ``numel`` elements."""
    return range(0, numel, block)


def as_flat_f32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a contiguous 1-D float32 tensor, without a copy where it already is one."""
    return x.detach().to(torch.float32).contiguous().reshape(-1)


def pieces(acc: torch.Tensor, block: int = BLOCK_NUMEL) -> Iterator[tuple[int, torch.Tensor]]:
    """``(start, view)``: views of ``acc`` of at most about ``block`` elements, in order,
    each holding the row-major elements ``[start, start + view.numel())`` of ``acc``.

    A contiguous ``acc`` splits flat; a strided one (a shard narrowed out of a larger
    tensor) by rows of its first dimension, a row too large for a block by its own rows.
    """
    if acc.is_contiguous() or acc.dim() <= 1:
        flat = acc.view(-1) if acc.is_contiguous() else acc
        for start in blocks(flat.numel(), block):
            yield start, flat[start : start + block]
        return
    row = acc[0].numel() if acc.shape[0] else 0
    if row > block:
        for i in range(acc.shape[0]):
            for start, view in pieces(acc[i], block):
                yield i * row + start, view
        return
    rows = max(1, block // max(row, 1))
    for first in range(0, acc.shape[0], rows):
        yield first * row, acc[first : first + rows]


def storage_index(acc: torch.Tensor, idx_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(base, offsets_k)`` with ``base[offsets_k]`` the elements of ``acc`` at the
    row-major flat indices ``idx_k``: ``acc.view(-1)`` itself when ``acc`` is contiguous,
    else a 1-D view of its storage (a shard narrowed out of a larger tensor)."""
    if acc.is_contiguous() or acc.numel() == 0:
        return acc.reshape(-1), idx_k
    offsets_k = torch.zeros_like(idx_k)
    rest_k = idx_k.clone()
    for size, stride in zip(reversed(acc.shape), reversed(acc.stride()), strict=True):
        offsets_k += (rest_k % size) * stride
        rest_k //= size
    span = 1 + sum(
        (size - 1) * stride for size, stride in zip(acc.shape, acc.stride(), strict=True)
    )
    return acc.as_strided((span,), (1,), acc.storage_offset()), offsets_k


def residual_memory(g_flat: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor | None:
    """Where ``encode_with_feedback`` sums ``p = g + e`` and leaves ``e'``: the residual
    itself as a 1-D view when it is contiguous float32 of ``g``'s size, else a float32
    copy of it (None without one)."""
    if residual is None:
        return None
    if residual.numel() != g_flat.numel():
        raise ValueError(f"residual has {residual.numel()} elements, g has {g_flat.numel()}")
    if residual.dtype == torch.float32 and residual.is_contiguous():
        return residual.view(-1)
    return as_flat_f32(residual).clone()

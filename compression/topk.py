"""Top-k sparsification: the k largest magnitudes, INT8 or FP16 values, packed indices."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from skyfed.compression import frame, lowbit, packing
from skyfed.compression.base import (
    Capabilities,
    Codec,
    Parsed,
    PayloadError,
    as_flat_f32,
    beside,
    check_accumulator,
    expected_shape,
    in_parallel,
    output_tensor,
    residual_memory,
    spans,
    storage_index,
)
from skyfed.compression.fp import fp16_scale, readonly_tensor
from skyfed.compression.norms import squared_norm
from skyfed.compression.select import TopKSelector, quantile

# The sparsest payload a decoder accepts: it never allocates more than this many dense
# elements per kept element, so a tiny payload cannot claim a huge tensor.
MIN_DENSITY = 1e-6
_VALUE_KINDS = ("int8", "fp16")
# Value kind 2: low-bit values (compression/lowbit.py), with their bits and block.
_LOWBIT_KIND = 2
_BITS = (*lowbit.BITS, 8)
_INDEX_VARINT, _INDEX_BITMAP = 0, 1
# Elements sampled to set one threshold over a set of tensors (all of a model this size).
_PLAN_SAMPLE = 1 << 20
_SCALE = struct.Struct("<f")
# Stateless: its buffers are per-thread scratch (base.SCRATCH).
_SELECTOR = TopKSelector()


class TopK(Codec):
    """Keep the ``k = max(1, round(density * n))`` largest magnitudes of ``p``.

    ``c = (I, q, s)`` with ``I`` the kept indices, ``q = round(p_I / s)`` in INT8 and
    ``s = max|p_I| / 127`` (or ``q = fp16(p_I / s)`` with FP16's power-of-two ``s``);
    ``D(c) = s * q`` at ``I``, zero elsewhere. With error feedback ``e' = p - D(c)``
    keeps both what was not selected and the values' rounding error. Selection is a
    sampled threshold (Lin et al. 2018, Deep Gradient Compression) refined to the exact
    set of between ``k`` and ``k (1 + 3 %)`` elements (:class:`TopKSelector`; a tensor
    of a :meth:`plan`'s set keeps exactly what is at or above the set's threshold); indices
    travel as delta varints or a bitmap, whichever is smaller, zstd-compressed when that
    is smaller still.

    ``bits`` = 2, 3 or 4 sends each kept value as a sign and a magnitude level between
    the smallest kept magnitude and its block's largest (a scale per block of 128 kept
    values, :mod:`~skyfed.compression.lowbit`; SparseLoCo's 2-bit choice): 9-10 bits per
    kept element with its index at 5 %, against 15 for INT8.

    Tensors under ``dense_below`` elements (biases, norms) keep every element, as Deep
    Gradient Compression does: they cost nothing on the wire, and starving them of
    updates is what slows Top-k training most (measured in ``bench/convergence.py``).
    """

    name = "topk"
    wire_id = 3
    capabilities = Capabilities(heaviness=30, sparse=True, color="#E69F00")

    def __init__(
        self,
        density: float = 0.01,
        values: str = "int8",
        dense_below: int = 1024,
        bits: int = 8,
    ) -> None:
        if not MIN_DENSITY <= density <= 1.0:
            raise ValueError(f"density must be in [{MIN_DENSITY}, 1], got {density!r}")
        if values not in _VALUE_KINDS:
            raise ValueError(f"values must be one of {_VALUE_KINDS}, got {values!r}")
        if bits not in _BITS or (bits != 8 and values != "int8"):
            raise ValueError(
                f"bits must be one of {_BITS} (below 8 with int8 values), got {bits!r}"
            )
        if dense_below < 0:
            raise ValueError(f"dense_below must be >= 0, got {dense_below!r}")
        self.density = float(density)
        self.values = values
        self.dense_below = dense_below
        self.bits = bits
        self._threshold: float | None = None
        """Set by :meth:`plan`: the set's threshold; each tensor keeps what is at or above
        it, its ``k`` counted by the selection's own pass (no pass of the plan's)."""

    def k_for(self, numel: int) -> int:
        """How many elements a tensor of ``numel`` keeps (all of a small one)."""
        if numel < self.dense_below:
            return numel
        return min(numel, max(min_kept(numel), round(self.density * numel)))

    def encode(self, x: torch.Tensor, out: frame.PayloadBuffer | None = None) -> bytes:
        """The framed payload: ``bytes``, or a view into ``out`` when one is lent."""
        return self._encode(as_flat_f32(x), tuple(x.shape), out)[0]

    def encode_with_feedback(
        self,
        g: torch.Tensor,
        residual: torch.Tensor | None,
        out: frame.PayloadBuffer | None = None,
    ) -> tuple[bytes, torch.Tensor]:
        """``e' = p`` with the kept elements replaced by their rounding error (no decode),
        in the residual's memory."""
        g_flat = as_flat_f32(g)
        e_flat = residual_memory(g_flat, residual)
        if e_flat is None:  # p is g itself, which stays the caller's
            payload, idx_k, kept_k, sent_k = self._encode(g_flat, tuple(g.shape), out)
            e_flat = g_flat.clone()
            e_flat.index_copy_(0, idx_k, kept_k.sub_(sent_k))  # e[I] = ...: 0.7x index_put
        else:  # p = e + g, summed in the residual's memory by the selection's first pass
            payload = self._encode(e_flat, tuple(g.shape), out, g_flat, residual=e_flat)[0]
        return payload, e_flat.view(g.shape)

    def encode_into_residual(
        self, p: torch.Tensor, out: frame.PayloadBuffer | None = None
    ) -> bytes:
        """``e' = p`` with the kept elements replaced by their rounding error, in ``p``."""
        if p.dtype != torch.float32 or not p.is_contiguous():
            return super().encode_into_residual(p, out)
        flat = p.view(-1)
        return self._encode(flat, tuple(p.shape), out, residual=flat)[0]

    def encode_into_residual_applied(
        self,
        p: torch.Tensor,
        acc: torch.Tensor,
        alpha: float = 1.0,
        out: frame.PayloadBuffer | None = None,
    ) -> bytes:
        """``acc[I] += alpha * D(c)`` from the indices and decoded values in hand: no parse
        of the payload (its indices' zstd, bitmap or varints, its values' dequantize)."""
        if p.dtype != torch.float32 or not p.is_contiguous() or acc.shape != p.shape:
            return super().encode_into_residual_applied(p, acc, alpha, out)
        check_accumulator(acc)
        flat = p.view(-1)
        payload, idx_k, kept_k, sent_k = self._encode(flat, tuple(p.shape), out)
        if len(sent_k) and not math.isfinite(float(sent_k.abs().max())):
            # What a receiver's parse refuses (FP16 or a huge scale overflows), refused
            # before anything changes here.
            raise PayloadError("topk payload holds non-finite values")
        _add_at(acc, idx_k, sent_k, alpha)
        flat.index_copy_(0, idx_k, kept_k.sub_(sent_k))
        return payload

    def _encode(
        self,
        flat: torch.Tensor,
        shape: tuple[int, ...],
        out: frame.PayloadBuffer | None = None,
        add: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> tuple[bytes, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The payload, the kept indices, the values kept there and the values the
        receiver will decode there. With ``add``, ``flat += add`` first (``p = e + g``).
        With ``residual`` (``flat`` itself), ``e' = p`` with the kept elements replaced by
        their rounding error, written beside the indices' packing: a scattered write
        over the tensor's memory, and the varints and zstd are compute (~6 and ~5 ms at
        16M, 5 %); the kept values are then their errors."""
        n = flat.numel()
        planned = None if self._threshold is None else self._planned_k(n)
        idx_k, kept_k = _SELECTOR.select_kept(
            flat,
            self.k_for(n),
            add_N=add,
            threshold=self._threshold,
            min_k=min_kept(n),
            k_of=planned,
        )
        value_bytes, scale, sent_k = self._quantize(kept_k)

        def rounding_error() -> None:  # e'[I] = p[I] - D(c)[I], single-threaded numpy
            if residual is not None:
                residual.numpy()[idx_k.numpy()] = kept_k.sub_(sent_k).numpy()

        index_kind, zstd, raw_len, index_bytes = beside(
            rounding_error, lambda: _pack_indices(idx_k.numpy(), flat.numel())
        )
        value_kind = _VALUE_KINDS.index(self.values) if self.bits == 8 else _LOWBIT_KIND
        lowbit_block = lowbit.DEFAULT_BLOCK if value_kind == _LOWBIT_KIND else 0
        params = Params(
            value_kind, index_kind, zstd, len(idx_k), scale, raw_len, self.bits, lowbit_block
        ).pack()
        payload = frame.pack(self.wire_id, shape, params, value_bytes, index_bytes, out=out)
        return payload, idx_k, kept_k, sent_k  # type: ignore[return-value]  # a view into out

    def _quantize(self, kept_k: torch.Tensor) -> tuple[bytes | memoryview, float, torch.Tensor]:
        """Wire bytes of the kept values, their scale, and the values they decode to."""
        if self.bits != 8:
            return lowbit.quantize(kept_k, self.bits, lowbit.DEFAULT_BLOCK)
        peak = float(kept_k.abs().max()) if kept_k.numel() else 0.0
        if not math.isfinite(peak):
            raise ValueError("top-k input holds inf or NaN among its largest elements")
        if self.values == "fp16":
            scale = np.float32(fp16_scale(peak))
            wire = (kept_k / float(scale)).to(torch.float16)
            return (
                memoryview(wire.view(torch.uint8).numpy()),
                float(scale),
                _dequantize(wire, scale),
            )
        scale = np.float32(peak / 127.0)
        q = torch.round(kept_k / float(scale)) if scale > 0 else torch.zeros_like(kept_k)
        q = q.clamp_(-127, 127).to(torch.int8)
        return memoryview(q.view(torch.uint8).numpy()), float(scale), _dequantize(q, scale)

    def decode(
        self,
        payload: bytes,
        out: torch.Tensor | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        f, idx_k, values_k = self._parse(payload, expected_shape(out, shape))
        result = output_tensor(f.shape, out)
        flat = result.view(-1).zero_()
        _scatter(flat, idx_k, values_k)
        return result

    def decode_add(self, payload: bytes, acc: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        """``acc[I] += alpha * D(c)``: touches the ``k`` kept elements only."""
        check_accumulator(acc)
        _, idx_k, values_k = self._parse(payload, tuple(acc.shape))
        _add_at(acc, idx_k, values_k, alpha)
        return acc

    def check_pieces(
        self,
        payload: bytes,
        out: torch.Tensor | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> Iterator[float]:
        """One piece, the ``k`` decoded values' squared norm: parsing already refuses
        non-finite values, and the elements not sent are zeros (``out`` is not needed)."""
        _, _, values_k = self._parse(payload, expected_shape(out, shape))
        yield squared_norm(values_k)

    def check_parsed(
        self,
        payload: bytes,
        out: torch.Tensor | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> tuple[float, Parsed | None]:
        """The ``k`` decoded values' squared norm (:meth:`check_pieces`), keeping the kept
        indices (int32 where they fit: 4 bytes, not 8) and decoded values for
        :meth:`Parsed.add_into`."""
        f, idx_k, values_k = self._parse(payload, expected_shape(out, shape))
        if f.numel <= _INT32_MAX:
            idx_k = idx_k.to(torch.int32)
        return squared_norm(values_k), _Kept(tuple(f.shape), idx_k, values_k)

    def _parse(
        self, payload: bytes, shape: tuple[int, ...] | None
    ) -> tuple[frame.Frame, torch.Tensor, torch.Tensor]:
        """The frame, its kept indices (int64) and decoded values, every count checked
        against the expected shape before anything of its size is allocated."""
        f = frame.unpack(payload, max_body=0, shape=shape)
        if f.codec != self.wire_id:
            raise PayloadError(f"payload is codec {f.codec}, not {self.name}")
        p = _checked_params(f)
        if p.value_kind == _LOWBIT_KIND:
            size = lowbit.section_bytes(p.k, p.bits, p.block)
            values_k = lowbit.decode_section(f.body[:size], p.k, p.bits, p.block, p.scale)
        else:
            size = p.k * (1 if p.value_kind == 0 else 2)
            values_k = _decode_values(f.body[:size], p.value_kind, p.k, np.float32(p.scale))
        idx_k = _unpack_indices(f.body[size:], p.index_kind, p.zstd, p.raw_len, p.k, f.numel)
        return f, torch.from_numpy(idx_k), values_k

    def plan(
        self, pending: dict[str, torch.Tensor], add: dict[str, torch.Tensor] | None = None
    ) -> dict[str, Codec]:
        """One threshold over every tensor of the set, so the set keeps ``density`` overall
        but each tensor keeps what is above the threshold: ``k_i = #{|p_i| >= t}``.

        Per-tensor top-k makes a tensor whose update is small and flat send as much as one
        whose update matters; one threshold moved Top-k 1 %'s final loss from +3.37 % to
        +1.92 % of FP32's on the same three seeds (docs/decisions/topk-threshold-per-tensor.md).
        ``t`` is the ``k``-th
        magnitude of a strided sample of at most ``_PLAN_SAMPLE`` elements over the set;
        each tensor's ``k_i`` is counted by its own selection pass as it encodes, which
        keeps those elements (the plan makes no pass of its own over the tensors).
        Tensors under ``dense_below`` still go whole.
        """
        big = {k: v for k, v in pending.items() if v.numel() >= max(1, self.dense_below)}
        plan: dict[str, Codec] = dict.fromkeys(pending, self)
        total = sum(v.numel() for v in big.values())
        if len(big) < 2 or self.density >= 1.0:
            return plan
        stride = max(1, total // _PLAN_SAMPLE)
        strided = {key: v.detach().reshape(-1)[::stride] for key, v in big.items()}
        sample = torch.empty(sum(s.numel() for s in strided.values()))
        at = 0
        for key, s in strided.items():  # |p| straight into the one sample: nothing to join
            into = sample[at : at + s.numel()]
            if add is not None and key in add:  # p = e + g, summed here for the sample only
                torch.add(s, add[key].detach().reshape(-1)[::stride], out=into).abs_()
            else:
                torch.abs(s, out=into)
            at += s.numel()
        rank = max(1, round(self.density * sample.numel()))
        threshold = quantile(sample, rank)  # the rank-th largest, by selection: no sort
        if not (math.isfinite(threshold) and threshold > 0.0):
            return plan
        planned = self._with_density(self.density)
        planned._threshold = threshold  # each tensor's k is its count, taken as it encodes
        plan.update(dict.fromkeys(big, planned))
        return plan

    def _planned_k(self, numel: int) -> Callable[[int], int]:
        """A planned tensor's ``k`` from its count at the set's threshold: the count itself,
        unless that is fewer than the decoder accepts (:func:`min_kept`) or none."""

        def k_of(count: int) -> int:
            return self._with_density(min(1.0, max(count / numel, MIN_DENSITY))).k_for(numel)

        return k_of

    def for_downlink(self, senders: int) -> TopK:
        """Top-k at ``senders`` times the density: room for the union of what was sent.

        The mean of ``senders`` top-k uplinks has up to ``senders * k`` non-zeros. Cutting
        it back to ``k`` parks most of what the agents sent in the coordinator's residual
        for rounds, which cost as much convergence as the uplink's own sparsification
        (docs/decisions/downlink-density.md); Deep Gradient Compression's all-gather
        likewise delivers every
        worker's ``k`` to every worker.
        """
        return self._with_density(min(1.0, self.density * max(1, senders)))

    def _with_density(self, density: float) -> TopK:
        return TopK(density, values=self.values, dense_below=self.dense_below, bits=self.bits)

    def __repr__(self) -> str:
        return (
            f"TopK(density={self.density}, values={self.values!r}, "
            f"dense_below={self.dense_below}, bits={self.bits})"
        )


_INT32_MAX = 2**31 - 1


class _Kept(Parsed):
    """A Top-k payload's kept indices and decoded values, as its check parsed them."""

    __slots__ = ("idx_k", "shape", "values_k")

    def __init__(self, shape: tuple[int, ...], idx_k: torch.Tensor, values_k: torch.Tensor):
        self.shape, self.idx_k, self.values_k = shape, idx_k, values_k

    def add_into(self, acc: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        """``acc[I] += alpha * D(c)``: :meth:`TopK.decode_add` after its parse, the same
        ``_add_at`` on the same indices and values (int32 indices index as int64 do)."""
        check_accumulator(acc)
        if tuple(acc.shape) != self.shape:
            raise PayloadError(f"payload has shape {list(self.shape)}, expected {list(acc.shape)}")
        idx_k = self.idx_k
        if not acc.is_contiguous():  # a shard's storage offsets, computed in int64
            idx_k = idx_k.to(torch.int64)
        _add_at(acc, idx_k, self.values_k, alpha)
        return acc


def min_kept(numel: int) -> int:
    """The fewest elements a payload of ``numel`` may keep: the decoder refuses fewer
    (:data:`MIN_DENSITY`)."""
    k = max(1, math.ceil(numel * MIN_DENSITY))
    while k / MIN_DENSITY < numel:  # the decoder's own test, in its float arithmetic
        k += 1
    return min(k, numel)


_FLOAT32_MAX = float(np.finfo(np.float32).max)
# Kept elements per span below which a scatter runs on one thread.
_INDEX_SPAN = 1 << 16
# Kept elements added per step of :func:`_add_at`: under torch's parallel grain (32768), so
# each thread's ``add_`` runs on that thread, and the elements of ``acc`` it gathered are
# still in cache when it writes them back (16K kept: ~1 MB of ``acc``'s lines at 5 %).
_ADD_CHUNK = 1 << 14


def _add_at(acc: torch.Tensor, idx_k: torch.Tensor, values_k: torch.Tensor, alpha: float) -> None:
    """``acc[idx_k] += alpha * values_k`` (row-major flat indices, distinct, in range);
    ``values_k`` is only read.

    Bit for bit ``acc.add_(decoded, alpha=alpha)`` (torch's fused multiply-add, which
    ``index_add_`` is not: it rounds ``alpha * v`` first), for every ``alpha``. A chunk
    at a time per thread, gathered, added and written back while its lines are in cache:
    half the time of one gather, add and scatter over all ``k`` (three sweeps of ``acc``'s
    memory for two), and no slower than ``index_add_`` (docs/codecs-performance.md).
    """
    base, offsets_k = storage_index(acc, idx_k)
    base_np, idx = base.detach().numpy(), offsets_k.numpy()
    values = values_k.detach()

    def span(lo: int, hi: int) -> None:
        kept = np.empty(min(_ADD_CHUNK, hi - lo), dtype=base_np.dtype)
        kept_t = torch.from_numpy(kept)
        for start in range(lo, hi, _ADD_CHUNK):
            stop = min(start + _ADD_CHUNK, hi)
            at = idx[start:stop]
            np.take(base_np, at, out=kept[: stop - start], mode="clip")
            kept_t[: stop - start].add_(values[start:stop], alpha=alpha)
            base_np[at] = kept[: stop - start]

    in_parallel(span, spans(len(idx), _ADD_CHUNK))


def _scatter(base: torch.Tensor, idx_k: torch.Tensor, values_k: torch.Tensor) -> None:
    """``base[idx_k] = values_k`` (1-D, distinct indices in range), a span per core."""
    base_np, idx, values = base.detach().numpy(), idx_k.numpy(), values_k.numpy()

    def span(lo: int, hi: int) -> None:
        base_np[idx[lo:hi]] = values[lo:hi]

    in_parallel(span, spans(len(idx), _INDEX_SPAN))


def _dequantize(q_k: torch.Tensor, scale: np.float32) -> torch.Tensor:
    """The one definition of ``D`` for the values (INT8 or FP16), shared by both ends."""
    return q_k.to(torch.float32).mul_(float(scale))


def _pack_indices(idx_k: np.ndarray, numel: int) -> tuple[int, int, int, bytes | np.ndarray]:
    """(index kind, zstd flag, raw length, bytes) for the smallest index encoding."""
    bitmap_len = (numel + 7) // 8
    # Varints take at least a byte per index: above 1/8 density the bitmap is smaller
    # without writing them (the downlink at 3 x 5 %).
    varint = packing.varint_gaps(idx_k) if len(idx_k) <= bitmap_len else None
    if varint is not None and len(varint) <= bitmap_len:
        kind, raw = _INDEX_VARINT, varint
    else:
        kind, raw = _INDEX_BITMAP, packing.bitmap(idx_k, numel)
    packed = frame.compress(memoryview(raw)) if len(raw) > 64 else b""
    if packed and len(packed) < len(raw):
        return kind, 1, len(raw), packed
    return kind, 0, len(raw), raw


@dataclass(frozen=True, slots=True)
class Params:
    """A Top-k frame's parameters, in the order they travel.

    Layout: ``kinds u8`` (value kind in bits 0-1, index kind in bit 2, index zstd in bit
    3) | ``k`` varint | ``scale`` f32 (the floor ``f`` for low-bit values) | index raw
    bytes varint | low-bit values only: ``bits u8`` | ``block`` varint. 7-12 bytes on
    the bench's tensors, where version 1's fixed fields took 24-32.
    """

    value_kind: int
    index_kind: int
    zstd: int
    k: int
    scale: float
    raw_len: int
    bits: int = 8
    block: int = 0
    """The low-bit values' block (0 for INT8 and FP16 values)."""

    def pack(self) -> bytes:
        out = bytearray((self.value_kind | self.index_kind << 2 | self.zstd << 3,))
        frame.put_varint(out, self.k)
        out += _SCALE.pack(self.scale)
        frame.put_varint(out, self.raw_len)
        if self.value_kind == _LOWBIT_KIND:
            out.append(self.bits)
            frame.put_varint(out, self.block)
        return bytes(out)

    @classmethod
    def unpack(cls, params: bytes) -> Params:
        """The fields as they lie, their ranges not yet checked (:func:`_checked_params`)."""
        if not params:
            raise PayloadError("topk payload has no parameters")
        kinds = params[0]
        if kinds >> 4:
            raise PayloadError(f"topk parameters are corrupt (kinds {kinds:#x})")
        k, at = frame.get_varint(params, 1, "topk parameters")
        if len(params) < at + _SCALE.size:
            raise PayloadError(f"topk payload has {len(params)} parameter bytes")
        (scale,) = _SCALE.unpack_from(params, at)
        raw_len, at = frame.get_varint(params, at + _SCALE.size, "topk parameters")
        bits, block, value_kind = 8, 0, kinds & 3
        if value_kind == _LOWBIT_KIND:
            if len(params) <= at:
                raise PayloadError(f"topk payload has {len(params)} parameter bytes")
            bits = params[at]
            block, at = frame.get_varint(params, at + 1, "topk parameters")
        if at != len(params):
            raise PayloadError(f"topk payload has {len(params)} parameter bytes")
        return cls(value_kind, kinds >> 2 & 1, kinds >> 3 & 1, k, scale, raw_len, bits, block)


def _checked_params(f: frame.Frame) -> Params:
    """The parameters, checked against the frame's shape before anything is allocated."""
    p = Params.unpack(f.params)
    if p.value_kind == _LOWBIT_KIND and (
        p.bits not in lowbit.BITS or not 1 <= p.block <= lowbit.MAX_BLOCK
    ):
        raise PayloadError(f"topk low-bit parameters are corrupt (bits={p.bits}, block={p.block})")
    if p.value_kind > _LOWBIT_KIND:
        raise PayloadError(f"topk parameters are corrupt (value kind {p.value_kind})")
    k, n = p.k, f.numel
    if k > n or (n and not n <= max(k, 1) / MIN_DENSITY) or (n and not k):
        raise PayloadError(f"topk payload keeps {k} of {n} elements")
    if not (math.isfinite(p.scale) and p.scale >= 0.0):
        raise PayloadError(f"topk payload has scale {p.scale}")
    limit = (n + 7) // 8 if p.index_kind == _INDEX_BITMAP else k * packing.MAX_VARINT_BYTES
    if p.raw_len > limit:
        raise PayloadError(f"topk index section claims {p.raw_len} bytes, at most {limit}")
    return p


def _decode_values(body: memoryview, kind: int, k: int, scale: np.float32) -> torch.Tensor:
    if len(body) != k * (1 if kind == 0 else 2):
        raise PayloadError(f"topk body is too short for {k} values")
    if k == 0:
        return torch.zeros(0)
    wire_dtype = np.int8 if kind == 0 else np.float16
    values_k = _dequantize(readonly_tensor(np.frombuffer(body, dtype=wire_dtype)), scale)
    # A finite but huge scale (a flipped exponent bit) overflows INT8 values too: they are
    # all finite when 128 x scale is below float32's largest (|q| <= 128, and rounding is
    # monotonic), so INT8 needs no pass over them. FP16 values may be inf or NaN themselves: the largest
    # magnitude is NaN or inf exactly when some value is (torch.isfinite is a composite of
    # several kernels: 5x this).
    if kind == 0 and 128.0 * float(scale) < _FLOAT32_MAX:
        return values_k
    if not math.isfinite(float(values_k.abs().max())):
        raise PayloadError("topk payload holds non-finite values")
    return values_k


def _unpack_indices(
    body: memoryview, kind: int, zstd: int, raw_len: int, k: int, numel: int
) -> np.ndarray:
    raw = frame.decompress(body, raw_len) if zstd else body
    if len(raw) != raw_len:
        raise PayloadError(f"topk index section is {len(raw)} bytes, frame says {raw_len}")
    data = np.frombuffer(raw, dtype=np.uint8)
    if kind == _INDEX_BITMAP:
        return packing.unbitmap(data, k, numel)
    return packing.unvarint_gaps(data, k, numel)

"""A round's contributions, checked as they arrive, held encoded, summed at the close
straight into where the mean goes (docs/scale.md, The aggregate).

Why staged, not summed on arrival: withdrawing a contribution refused half-way must leave
the sum exactly as if it never came. Summed on arrival, that needs a float64 sum (8 bytes
per parameter, twice the model) *and* the encoded payloads kept to subtract them again.
Held encoded until the close, a withdrawal is dropping the payloads, exact by construction,
and the sum needs no buffer of its own: the mean of each tensor is decoded straight into
the caller's float32 tensor (``Codec.decode_add``), contributions in a fixed order (by
agent), so a rerun of a seed gives the same bits whatever order the uploads finished in.
A float32 sum of n contributions is within ``n * 2**-24`` of the exact one, far under any
codec's own error (FP16: ``2**-11``).

A Top-k payload is held with the parse its check on arrival made (its kept indices and
values, 8 bytes a kept element: ``Codec.check_parsed``), and the close adds from that:
the same additions in the same order, without parsing every staged uplink a second time
on the round's critical path (docs/wan.md, A round's critical path).

Past a budget (``stage_memory`` times the model's float32 bytes) the dense payloads that
arrive are staged in an unlinked file instead, put together there as their chunks arrive,
and the close reads them where they lie (``coordinator/spill.py``): what the coordinator
holds for a round's uplinks, arriving or staged, then stops growing with the number of
agents.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import torch

from skyfed.compression import (
    Parsed,
    PayloadError,
    check_payload_parsed,
    check_pieces_payload,
    codec_names,
    decode_add_payload,
    decode_add_pieces_payload,
    keeps_parse,
    needs_check_scratch,
    payload_codec,
)
from skyfed.compression.base import pieces
from skyfed.coordinator.spill import SPILL_MIN_BYTES, SpillFile, SpillRegion
from skyfed.errors import BadContributionError, ProtocolError
from skyfed.fingerprint import TensorInfo
from skyfed.wire import Payload, ShardCoords, shard_shape

log = logging.getLogger(__name__)

_T = TypeVar("_T")

CHECK_BUFFERS = 1
"""Payloads decoded at once for their check, each buffer as large as the largest tensor,
for the codecs whose check is a dense decode (``needs_check_scratch``: EC-SGD; FP16,
BF16 and FP32 check block by block, Top-k its k values, and never borrow one). One: a
check is a decode and two reductions, far under the time its bytes take to arrive, so a
second buffer (0.25x of a model of four such tensors) bought no speed."""


class RoundAggregate:
    """The committed contributions of one round, and the mean they make.

    Not thread-safe on its own: the federation calls ``stage``, ``commit``, ``withdraw``,
    ``mean_into`` and ``release`` under its one lock; only ``Contribution.check`` runs
    outside it (on the session's reader thread).
    """

    def __init__(
        self,
        spec: Sequence[TensorInfo],
        *,
        memory_bytes: int | None = None,
        spill_dir: Path | None = None,
    ) -> None:
        """``memory_bytes``: the staged payloads' bytes held in memory at most, the rest
        spilled to an unlinked file in ``spill_dir`` (None: all in memory)."""
        self.spec = list(spec)
        self.total_samples = 0
        self._committed: list[Contribution] = []
        self.memory_bytes = memory_bytes
        self.spill_dir = spill_dir
        self.held = 0
        """Bytes of staged payloads held in memory this round (withdrawn ones taken off)."""
        self.spilled = 0
        """Bytes of staged payloads spilled to disk this round."""
        self._hold_lock = threading.Lock()
        self._spill_capacity = sum(4 * t.numel + SPILL_MIN_BYTES for t in self.spec)
        """A contribution's file is sized for every tensor in FP32 with room for headers;
        a payload that does not fit stays in memory."""

    @property
    def committed(self) -> int:
        return len(self._committed)

    @property
    def contributions(self) -> list[Contribution]:
        """The committed contributions, in the order they committed."""
        return list(self._committed)

    def begin(self, samples: int, key: str = "") -> Contribution:
        """Open a contribution of ``samples`` samples; ``key`` (the agent) orders the sum."""
        if samples < 1:
            raise ProtocolError(f"a contribution must count at least 1 sample, got {samples}")
        return Contribution(self, samples, key)

    def mean_into(self, tensor: int, out: torch.Tensor) -> torch.Tensor:
        """``out`` (float32, the tensor's shape) = the sample-weighted mean of ``tensor``
        over the committed contributions, decoded into it in key order."""
        if not self._committed:
            raise RuntimeError("no contribution was committed this round")
        if tuple(out.shape) != self.spec[tensor].shape or out.dtype != torch.float32:
            raise ValueError(f"out must be float32 {list(self.spec[tensor].shape)}")
        ordered = sorted(self._committed, key=lambda c: c.key)
        terms = [
            (payload, parsed, contribution.samples * contribution.factor)
            for contribution in ordered
            for payload, parsed in zip(
                contribution.staged.get(tensor, ()), contribution.kept.get(tensor, ()), strict=True
            )
        ]
        files = [c.spill for c in ordered if c.spill is not None]
        # Elementwise payloads (nothing kept by their check) sum piece by piece.
        if out.is_contiguous() and all(p.shard is None and k is None for p, k, _ in terms):
            steps = [decode_add_pieces_payload(p.data, out, alpha) for p, _, alpha in terms]
            pieces = [step for step in steps if step is not None]
            if len(pieces) == len(steps):
                return self._mean_by_pieces(out, pieces, files)
        out.zero_()
        for payload, parsed, alpha in terms:
            into = _narrow(out, payload.shard)
            if parsed is None:
                decode_add_payload(payload.data, into, alpha)
            else:  # the check's parse (Top-k): bit for bit the decode_add above
                parsed.add_into(into, alpha)
            for file in files:
                file.forget()
        return out.div_(self.total_samples)

    def _mean_by_pieces(
        self, out: torch.Tensor, steps: list[Iterator[None]], files: list[SpillFile]
    ) -> torch.Tensor:
        """The same sum, one piece of ``out`` at a time: zeroed, every term added in key
        order, divided, while the piece is in cache (one pass over ``out``, not one per
        term and two more; each element sees the same operations in the same order).
        The spilled payloads' pages are let go after each piece, so the process maps about
        a piece of each at a time."""
        for _, view in pieces(out):
            view.zero_()
            for step in steps:
                next(step)
            view.div_(self.total_samples)
            for file in files:
                file.forget()
        return out

    def memory(
        self,
        contribution: Contribution,
        nbytes: int,
        codec: str,
        pool: Callable[[int], memoryview],
    ) -> memoryview | SpillRegion:
        """Where a payload of at most ``nbytes`` that arrives in several chunks, naming
        ``codec``, is put together: ``pool``'s memory while the round's budget has room
        for it (its bytes counted from now, so payloads arriving at once do not all find
        the same room), else a region of its contribution's file, so it takes no memory
        while it arrives. A payload whose check keeps its parse (Top-k), or of a codec
        this build does not know (its check refuses it), goes to memory."""
        spillable = codec in codec_names() and not keeps_parse(codec)
        with self._hold_lock:  # the room is judged and taken at once
            in_memory = not spillable or self._fits(nbytes)
            if in_memory:
                self._count_arriving(contribution, nbytes)
        if not in_memory:
            region = self._spilled(contribution, lambda file: file.region(nbytes))
            if region is not None:
                return region
            with self._hold_lock:  # no file, no room: in memory after all
                self._count_arriving(contribution, nbytes)
        return pool(nbytes)

    def hold(self, contribution: Contribution, payload: Payload, parsed: Parsed | None) -> Payload:
        """``payload`` as it is to be staged: in memory while the round's budget allows (or
        where its check's parse is kept, or it is small), else spilled to its
        contribution's file (the same bytes, read where they lie at the close). One put
        together in the file as it arrived (:meth:`memory`) is staged where it is."""
        nbytes = len(payload.data)
        file = contribution.spill
        if file is not None and file.holds(payload.data):
            with self._hold_lock:
                self.spilled += nbytes
            return payload
        with self._hold_lock:
            # What :meth:`memory` counted while it arrived gives way to its real size.
            self._count_held(contribution, -contribution.arriving)
            contribution.arriving = 0
            if parsed is not None or self._fits(nbytes):
                self._count_held(contribution, nbytes)
                return payload
        spilled = self._spilled(contribution, lambda file: file.write(payload.data))
        with self._hold_lock:
            if spilled is None:  # no file, or its file is full: kept in memory after all
                self._count_held(contribution, nbytes)
                return payload
            self.spilled += nbytes
        return replace(payload, data=spilled)  # type: ignore[arg-type]

    def _fits(self, nbytes: int) -> bool:
        """Whether a payload of ``nbytes`` stays in memory (the caller holds the lock)."""
        return (
            self.memory_bytes is None
            or nbytes < SPILL_MIN_BYTES
            or self.held + nbytes <= self.memory_bytes
        )

    def _count_held(self, contribution: Contribution, nbytes: int) -> None:
        self.held += nbytes
        contribution.held += nbytes

    def _count_arriving(self, contribution: Contribution, nbytes: int) -> None:
        """Count a payload put together in memory from its first chunk (the caller holds
        the lock); :meth:`hold` trades it for the payload's real size."""
        self._count_held(contribution, nbytes)
        contribution.arriving = nbytes

    def _spilled(self, contribution: Contribution, put: Callable[[SpillFile], _T]) -> _T | None:
        """``put(file)`` on its contribution's file, made on first use; None where no file
        can be made or used (no directory, no room): memory is still exact."""
        try:
            if contribution.spill is None:
                contribution.spill = SpillFile(self.spill_dir, self._spill_capacity)
            return put(contribution.spill)
        except OSError as exc:
            _warn_once(
                f"[Coordinator.Stage] cannot stage uplinks in {self.spill_dir}: {exc.strerror}"
            )
            return None

    def let_go(self, contribution: Contribution) -> None:
        """A withdrawn contribution's memory is no longer held: others may stage in it."""
        with self._hold_lock:
            self.held -= contribution.held
            contribution.held = contribution.arriving = 0

    def mean(self) -> list[torch.Tensor]:
        """Every tensor's mean, in new tensors (tests and small models; the federation
        uses :meth:`mean_into` tensor by tensor)."""
        return [self.mean_into(i, torch.empty(t.shape)) for i, t in enumerate(self.spec)]

    def release(self, tensor: int) -> None:
        """Drop the payloads of ``tensor``: its mean is taken, its memory goes back."""
        for contribution in self._committed:
            contribution.staged.pop(tensor, None)
            contribution.kept.pop(tensor, None)


@dataclass(frozen=True, slots=True)
class Checked:
    """A payload its contribution has checked: what :meth:`Contribution.stage` holds."""

    payload: Payload
    squares: float
    """The squared L2 norm of its values."""
    parsed: Parsed | None
    """The check's parse, kept for the close (Top-k's indices and values); None: none."""


class Contribution:
    """One agent's update for one round, checked payload by payload, held encoded."""

    def __init__(self, aggregate: RoundAggregate, samples: int, key: str) -> None:
        self._agg = aggregate
        self.samples = samples
        self.key = key
        self.staged: dict[int, list[Payload]] = {}
        self.kept: dict[int, list[Parsed | None]] = {}
        """Beside each staged payload, the parse its check made (None: none kept), so the
        close adds from it and parses no staged uplink again (``Codec.check_parsed``)."""
        self._covered: dict[int, _Coverage] = {}
        self.held = 0
        """Bytes of its staged payloads held in memory (the round's budget counts them)."""
        self.spill: SpillFile | None = None
        """Its payloads staged on disk, past the round's budget (``coordinator/spill.py``)."""
        self.arriving = 0
        """Bytes counted in memory for the payload it is putting together there
        (``RoundAggregate.memory``), until that payload is held."""
        self.done = False
        self.squares = 0.0
        """The squared L2 norm of its staged payloads' values: its update's norm, once
        every payload is in (``coordinator/robust.py`` bounds it)."""
        self.factor = 1.0
        """What its update is scaled by in the mean (norm clipping, ``coordinator/robust.py``)."""

    def check(self, payload: Payload) -> Checked:
        """Validate one payload fully (codec, shape, finite values) and claim its slice;
        the payload with the squared L2 norm of its values (the update's norm bound adds
        them up) and the parse the check made, for :meth:`stage`.

        Needs no lock: only the session's own reader thread calls it.
        """
        info = self._spec(payload.tensor)
        coverage = self._covered.setdefault(payload.tensor, _Coverage(info))
        interval = coverage.claim(payload.shard)
        file = self.spill if self.spill is not None and self.spill.holds(payload.data) else None
        try:
            squares, parsed = _check_payload(payload, info, None if file is None else file.forget)
        finally:
            if file is not None:  # read through the map: its pages go
                file.forget()
        coverage.commit(interval)
        return Checked(self._agg.hold(self, payload, parsed), squares, parsed)

    def memory(
        self, pool: Callable[[int], memoryview]
    ) -> Callable[[int, str], memoryview | SpillRegion]:
        """The assembler's memory for this contribution's payloads
        (:meth:`RoundAggregate.memory`, ``pool`` lending the memory)."""
        return lambda nbytes, codec: self._agg.memory(self, nbytes, codec, pool)

    def stage(self, checked: Checked) -> None:
        """Hold a checked payload until the close, with its check's parse; the caller
        holds the federation's lock."""
        if not self.done:
            payload = checked.payload
            self.squares += checked.squares
            self.staged.setdefault(payload.tensor, []).append(payload)
            self.kept.setdefault(payload.tensor, []).append(checked.parsed)
        else:  # withdrawn while it was checked: what that check held goes too
            self._agg.let_go(self)

    @property
    def complete(self) -> bool:
        spec = self._agg.spec
        return len(self._covered) == len(spec) and all(c.full for c in self._covered.values())

    def commit(self) -> None:
        if not self.complete:
            missing = [t.name for i, t in enumerate(self._agg.spec) if not self._is_full(i)]
            raise BadContributionError(f"contribution ends without tensors {missing[:5]}")
        self._agg.total_samples += self.samples
        self._agg._committed.append(self)
        self.done = True

    def scale(self, factor: float) -> None:
        """Count the update ``factor`` times its size (norm clipping,
        ``coordinator/robust.py``); its weight in the mean's denominator stays its samples."""
        self.factor *= factor

    def withdraw(self) -> None:
        """Drop what was staged: the round's sum is exactly as if it never came."""
        self.staged.clear()
        self.kept.clear()
        self.spill = None  # its file goes with the last view of it
        self.done = True
        self._agg.let_go(self)

    def _spec(self, tensor: int) -> TensorInfo:
        if tensor >= len(self._agg.spec):
            raise ProtocolError(f"tensor {tensor} does not exist ({len(self._agg.spec)} tensors)")
        return self._agg.spec[tensor]

    def _is_full(self, tensor: int) -> bool:
        cov = self._covered.get(tensor)
        return cov is not None and cov.full


class _Coverage:
    """Which slices of one tensor a contribution has sent: no overlap, no gap at commit."""

    def __init__(self, info: TensorInfo) -> None:
        self.info = info
        self.dim: int | None = None
        self.intervals: list[tuple[int, int]] = []

    def claim(self, shard: ShardCoords) -> tuple[int, int]:
        dim, start, stop = _interval(self.info, shard)
        if self.dim is not None and dim != self.dim:
            raise BadContributionError(
                f"{self.info.name}: shards split both dim {self.dim} and {dim}"
            )
        for a, b in self.intervals:
            if start < b and a < stop:
                raise ProtocolError(f"{self.info.name}: slice [{start}, {stop}) was already sent")
        self.dim = dim
        return start, stop

    def commit(self, interval: tuple[int, int]) -> None:
        self.intervals.append(interval)

    @property
    def full(self) -> bool:
        extent = self.info.shape[self.dim] if self.info.shape and self.dim is not None else 1
        return sum(b - a for a, b in self.intervals) == extent


def _interval(info: TensorInfo, shard: ShardCoords) -> tuple[int, int, int]:
    if shard is None:
        return 0, 0, (info.shape[0] if info.shape else 1)
    dim, offset, length = shard
    if dim >= len(info.shape) or offset < 0 or length < 1 or offset + length > info.shape[dim]:
        raise BadContributionError(
            f"{info.name}: shard dim={dim} offset={offset} length={length} is outside "
            f"shape {list(info.shape)}"
        )
    return dim, offset, offset + length


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("%s; holding them in memory", message)


def _narrow(t: torch.Tensor, shard: ShardCoords) -> torch.Tensor:
    return t if shard is None else t.narrow(shard[0], shard[1], shard[2])


class _CheckBuffers:
    """A few float32 buffers the finiteness checks decode into, lent one at a time."""

    def __init__(self, count: int) -> None:
        self._free = [torch.empty(0) for _ in range(count)]
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def borrow(self, shape: tuple[int, ...]) -> Iterator[torch.Tensor]:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._free))
            buf = self._free.pop()
        numel = 1
        for d in shape:
            numel *= d
        if buf.numel() < numel:
            buf = torch.empty(numel)
        try:
            yield buf[:numel].view(shape)
        finally:
            with self._cond:
                self._free.append(buf)
                self._cond.notify()


_CHECKS = _CheckBuffers(CHECK_BUFFERS)


def _check_payload(
    payload: Payload, info: TensorInfo, between: Callable[[], None] | None = None
) -> tuple[float, Parsed | None]:
    """The payload's squared norm, and the parse its check keeps; ``between`` is called
    after each piece the codec checks (letting a map's pages go: one spilled as it
    arrived)."""
    if payload.codec not in codec_names():
        raise BadContributionError(
            f"unknown codec {payload.codec!r}; this coordinator decodes {', '.join(codec_names())}"
        )
    expected = shard_shape(info.shape, payload.shard)
    try:
        framed = payload_codec(payload.data)
        if framed != payload.codec:
            raise BadContributionError(f"chunk says codec {payload.codec}, payload is {framed}")
        # FP16/BF16/FP32 check block by block and Top-k its k values only: no buffer.
        if not needs_check_scratch(payload.data):
            if between is None or keeps_parse(framed):
                return check_payload_parsed(payload.data, shape=expected)
            squares = 0.0
            for piece in check_pieces_payload(payload.data, shape=expected):
                squares += piece
                between()
            return squares, None
        with _CHECKS.borrow(expected) as values:  # a dense decode (EC-SGD)
            return check_payload_parsed(payload.data, out=values)
    except PayloadError as exc:
        raise BadContributionError(f"{info.name}: {exc}") from exc

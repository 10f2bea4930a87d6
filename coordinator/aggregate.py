"""Streaming, sample-weighted aggregation of contributions, in logical coordinates.

Memory grows with the model, not with agents x model: one float64 sum per tensor, plus,
per contribution in flight, the *encoded* payloads already added, kept only so that a
contribution refused half-way can be subtracted again. float64 sums make that withdrawal
exact to well below float32 resolution, and the mean independent of arrival order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from skyfed.compression import PayloadError, codec_names, decode_payload, payload_codec
from skyfed.errors import BadContributionError, ProtocolError
from skyfed.fingerprint import TensorInfo
from skyfed.wire import Payload, ShardCoords


class RoundAggregate:
    """Sum of ``samples * update`` over committed and in-flight contributions of one round.

    Not thread-safe on its own: the federation calls ``apply``, ``commit``, ``withdraw`` and
    ``mean`` under its one lock; only ``Contribution.check`` runs outside it.
    """

    def __init__(self, spec: Sequence[TensorInfo]) -> None:
        self.spec = list(spec)
        self._sums = [torch.zeros(t.shape, dtype=torch.float64) for t in self.spec]
        self.total_samples = 0
        self.committed = 0

    def begin(self, samples: int) -> Contribution:
        if samples < 1:
            raise ProtocolError(f"a contribution must count at least 1 sample, got {samples}")
        return Contribution(self, samples)

    def mean(self) -> list[torch.Tensor]:
        """The weighted mean of the committed contributions, float32."""
        if self.committed == 0:
            raise RuntimeError("no contribution was committed this round")
        return [(s / self.total_samples).to(torch.float32) for s in self._sums]

    def _add(self, tensor: int, shard: ShardCoords, values: torch.Tensor, sign: float) -> None:
        _narrow(self._sums[tensor], shard).add_(values.to(torch.float64), alpha=sign)


class Contribution:
    """One agent's update for one round, checked payload by payload before it is summed."""

    def __init__(self, aggregate: RoundAggregate, samples: int) -> None:
        self._agg = aggregate
        self.samples = samples
        self._added: list[Payload] = []
        self._covered: dict[int, _Coverage] = {}
        self.done = False

    def check(self, payload: Payload) -> torch.Tensor:
        """Validate one payload fully and claim its slice; returns the decoded values.

        Needs no lock: only the session's own reader thread calls it.
        """
        info = self._spec(payload.tensor)
        coverage = self._covered.setdefault(payload.tensor, _Coverage(info))
        interval = coverage.claim(payload.shard)
        values = _decode_checked(payload, info)
        coverage.commit(interval)
        return values

    def apply(self, payload: Payload, values: torch.Tensor) -> None:
        """Add checked values to the round's sum; the caller holds the federation's lock."""
        if self.done:
            return
        self._agg._add(payload.tensor, payload.shard, values, float(self.samples))
        self._added.append(payload)

    @property
    def complete(self) -> bool:
        spec = self._agg.spec
        return len(self._covered) == len(spec) and all(c.full for c in self._covered.values())

    def commit(self) -> None:
        if not self.complete:
            missing = [t.name for i, t in enumerate(self._agg.spec) if not self._is_full(i)]
            raise BadContributionError(f"contribution ends without tensors {missing[:5]}")
        self._agg.total_samples += self.samples
        self._agg.committed += 1
        self._added.clear()
        self.done = True

    def scale(self, factor: float) -> None:
        """Count what was added so far ``factor`` times instead (norm clipping,
        ``coordinator/robust.py``); before :meth:`commit`, under the federation's lock."""
        for payload in self._added:
            values = decode_payload(payload.data)
            self._agg._add(payload.tensor, payload.shard, values, -(1.0 - factor) * self.samples)

    def withdraw(self) -> None:
        """Subtract what was added so far; the round's sum is as if it never came."""
        for payload in reversed(self._added):
            values = decode_payload(payload.data)
            self._agg._add(payload.tensor, payload.shard, values, -float(self.samples))
        self._added.clear()
        self.done = True

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


def _shard_shape(info: TensorInfo, shard: ShardCoords) -> tuple[int, ...]:
    if shard is None:
        return info.shape
    dim, _, length = shard
    return info.shape[:dim] + (length,) + info.shape[dim + 1 :]


def _narrow(t: torch.Tensor, shard: ShardCoords) -> torch.Tensor:
    return t if shard is None else t.narrow(shard[0], shard[1], shard[2])


def _decode_checked(payload: Payload, info: TensorInfo) -> torch.Tensor:
    if payload.codec not in codec_names():
        raise BadContributionError(
            f"unknown codec {payload.codec!r}; this coordinator decodes {', '.join(codec_names())}"
        )
    try:
        framed = payload_codec(payload.data)
        if framed != payload.codec:
            raise BadContributionError(f"chunk says codec {payload.codec}, payload is {framed}")
        values = decode_payload(payload.data)
    except PayloadError as exc:
        raise BadContributionError(f"{info.name}: {exc}") from exc
    expected = _shard_shape(info, payload.shard)
    if tuple(values.shape) != expected:
        raise BadContributionError(
            f"{info.name}: payload has shape {list(values.shape)}, expected {list(expected)}"
        )
    if not bool(torch.isfinite(values).all()):
        raise BadContributionError(f"{info.name}: payload holds NaN or Inf values")
    return values

"""One rank's share of a contribution: the shards it owns, encoded with its own error feedback."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from skyfed.compression import Codec, ErrorFeedback, decode_add_payload, decode_payload
from skyfed.fingerprint import TensorInfo
from skyfed.wire import Payload, ShardCoords, shard_shape


def shard_key(name: str, shard: ShardCoords) -> str:
    """Error-feedback key of one slice: ``fc.weight`` whole, ``fc.weight[0:128@0]`` a shard."""
    if shard is None:
        return name
    dim, offset, length = shard
    return f"{name}[{offset}:{offset + length}@{dim}]"


class Uplink:
    """Encodes ``p = delta + e`` per owned slice; remembers what was sent until it is acked.

    A refused contribution is credited back into the residuals (``e += sent``), so its work
    is delayed, not lost; a round closed before we contributed goes wholly into them.
    """

    def __init__(self, spec: list[TensorInfo], shards: list[ShardCoords]) -> None:
        self.keys = [shard_key(t.name, s) for t, s in zip(spec, shards, strict=True)]
        self.shards = shards
        self.shapes = {
            key: shard_shape(t.shape, s) for key, t, s in zip(self.keys, spec, shards, strict=True)
        }
        self.feedback = ErrorFeedback()
        # What each unacknowledged contribution sent, still encoded (a fraction of the
        # model for most codecs, not a decoded copy of it); decoded only if it is refused.
        self._unacked: dict[int, dict[str, bytes]] = {}

    def encode(self, round: int, codec: Codec, delta: list[torch.Tensor | None]) -> list[Payload]:
        """Every payload of :meth:`stream`, at once."""
        return list(self.stream(round, codec, delta))

    def stream(
        self, round: int, codec: Codec, delta: list[torch.Tensor | None]
    ) -> Iterator[Payload]:
        """Payloads for the owned slices (``delta[i]`` not None), less empty shards, each
        as soon as it is encoded (docs/scale.md, Streams); error feedback in the residuals'
        own memory (``ErrorFeedback.encode``). ``delta``'s entries are let go as they
        are taken, so each slice's memory can go once it is encoded; the caller must
        exhaust the iterator (every residual is then updated)."""
        owned = {
            key: i
            for i, (key, d) in enumerate(zip(self.keys, delta, strict=True))
            if d is not None and ((shard := self.shards[i]) is None or shard[2] > 0)
        }

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            for key, i in owned.items():
                d, delta[i] = delta[i], None
                assert d is not None
                yield key, d

        encoded = self._unacked[round] = {}
        for key, data in self.feedback.encode(codec, tensors()):
            encoded[key] = data
            yield Payload(owned[key], self.shards[owned[key]], codec.name, data)

    def sent(self, round: int) -> list[torch.Tensor | None]:
        """What the contribution to ``round`` carried, decoded, per tensor (None: not ours)."""
        carried = self._unacked.get(round, {})
        return [
            None if key not in carried else decode_payload(carried[key], shape=self.shapes[key])
            for key in self.keys
        ]

    def keep(self, delta: list[torch.Tensor | None]) -> None:
        """The round closed while we trained: the whole delta waits in the residuals."""
        for key, d in zip(self.keys, delta, strict=True):
            if d is None:
                continue
            self.feedback.credit(key, d)

    def acked(self, round: int) -> None:
        self._unacked.pop(round, None)

    def refused(self, round: int) -> None:
        residuals = self.feedback.residuals
        for key, data in self._unacked.pop(round, {}).items():
            if key in residuals:
                decode_add_payload(data, residuals[key])  # e += D(c), in place
            else:
                residuals[key] = decode_payload(data, shape=self.shapes[key])

    def slices(self) -> list[tuple[int, ShardCoords, torch.Tensor]]:
        """This rank's residuals as (tensor index, slice, values): what a site's state file
        gathers into logical tensors (``skyfed.agent.state``)."""
        index = {key: i for i, key in enumerate(self.keys)}
        return [
            (index[key], self.shards[index[key]], residual)
            for key, residual in self.feedback.residuals.items()
            if key in index
        ]

    def restore(self, logical: dict[int, torch.Tensor], owned: list[bool]) -> int:
        """Take this rank's slices of whole logical residuals (by tensor index) for the
        slices it owns; returns how many it took."""
        taken = 0
        for i, full in logical.items():
            shard = self.shards[i]
            if not owned[i] or (shard is not None and shard[2] == 0):
                continue
            part = full if shard is None else full.narrow(shard[0], shard[1], shard[2])
            self.feedback.residuals[self.keys[i]] = part.clone()
            taken += 1
        return taken

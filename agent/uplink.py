"""One rank's share of a contribution: the shards it owns, encoded with its own error feedback."""

from __future__ import annotations

import torch

from skyfed.compression import Codec, ErrorFeedback
from skyfed.fingerprint import TensorInfo
from skyfed.wire import Payload, ShardCoords


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
        self.feedback = ErrorFeedback()
        self._unacked: dict[int, dict[str, torch.Tensor]] = {}

    def encode(self, round: int, codec: Codec, delta: list[torch.Tensor | None]) -> list[Payload]:
        """Payloads for the owned slices (``delta[i]`` not None), less empty shards."""
        owned = {
            i: (key, d)
            for i, (key, d) in enumerate(zip(self.keys, delta, strict=True))
            if d is not None and (self.shards[i] is None or self.shards[i][2] > 0)
        }
        encoded = self.feedback.encode_all(codec, dict(owned.values()))
        payloads = [
            Payload(i, self.shards[i], codec.name, encoded[key][0]) for i, (key, _) in owned.items()
        ]
        self._unacked[round] = {key: sent for key, (_, sent) in encoded.items()}
        return payloads

    def sent(self, round: int) -> list[torch.Tensor | None]:
        """What the contribution to ``round`` carried, decoded, per tensor (None: not ours)."""
        carried = self._unacked.get(round, {})
        return [carried.get(key) for key in self.keys]

    def keep(self, delta: list[torch.Tensor | None]) -> None:
        """The round closed while we trained: the whole delta waits in the residuals."""
        for key, d in zip(self.keys, delta, strict=True):
            if d is None:
                continue
            self.feedback.credit(key, d)

    def acked(self, round: int) -> None:
        self._unacked.pop(round, None)

    def refused(self, round: int) -> None:
        for key, s in self._unacked.pop(round, {}).items():
            self.feedback.credit(key, s)

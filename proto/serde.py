"""Every conversion between protobuf messages and our own objects, in one place."""

from __future__ import annotations

from collections.abc import Sequence

from skyfed.fingerprint import TensorInfo
from skyfed.proto import federation_pb2 as pb

# What a contribution can be (Hello.exchanges, Welcome.exchange): the change over local
# optimizer steps, or a momentum-corrected gradient step (skyfed.agent.momentum).
EXCHANGES = ("delta", "gradient")

# A shard is (dim, offset, length) along one dimension of a logical tensor; None is whole.
ShardCoords = tuple[int, int, int] | None


def specs_to_proto(spec: Sequence[TensorInfo]) -> list[pb.TensorSpec]:
    return [pb.TensorSpec(name=t.name, shape=list(t.shape), dtype=t.dtype) for t in spec]


def specs_from_proto(specs: Sequence[pb.TensorSpec]) -> list[TensorInfo]:
    return [TensorInfo(s.name, tuple(int(d) for d in s.shape), s.dtype) for s in specs]


def shard_to_proto(shard: ShardCoords) -> pb.Shard | None:
    return None if shard is None else pb.Shard(dim=shard[0], offset=shard[1], length=shard[2])


def shard_from_chunk(chunk: pb.Chunk) -> ShardCoords:
    if not chunk.HasField("shard"):
        return None
    return (chunk.shard.dim, chunk.shard.offset, chunk.shard.length)

"""The protocol's messages as plain dataclasses: what both ends work on, free of protobuf.

``proto/serde.py`` converts them to and from the generated messages; only it, the
coordinator's servicer and the agent's link touch protobuf. Field meanings are those of
``proto/federation.proto`` (see docs/protocol.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from skyfed.fingerprint import TensorInfo

EXCHANGES = ("delta", "gradient")
"""What a contribution can be (Hello.exchanges, Welcome.exchange): the change over local
optimizer steps, or a momentum-corrected gradient step (skyfed.agent.momentum)."""

ShardCoords = tuple[int, int, int] | None
"""A shard is (dim, offset, length) along one dimension of a logical tensor; None is whole."""


def shard_shape(shape: tuple[int, ...], shard: ShardCoords) -> tuple[int, ...]:
    """The shape of ``shard`` of a tensor of ``shape`` (``shape`` itself for None)."""
    if shard is None:
        return tuple(shape)
    dim, _, length = shard
    return (*shape[:dim], length, *shape[dim + 1 :])


PAYLOAD_SLACK_BYTES = 4096
"""What a codec's frame may add to a tensor's float32 bytes."""


def raw_bytes(spec: Sequence[TensorInfo]) -> int:
    """The model's float32 bytes: one transfer before compression (accounting only)."""
    return sum(t.numel * 4 for t in spec)


def max_payload_bytes(spec: Sequence[TensorInfo]) -> list[int]:
    """The largest payload each tensor may arrive as: its float32 bytes and a frame."""
    return [t.numel * 4 + PAYLOAD_SLACK_BYTES for t in spec]


class ChunkKind(IntEnum):
    """What a stream of chunks carries (values as in ``Chunk.Kind``)."""

    GRADIENT = 0
    AGGREGATE = 1
    WEIGHTS = 2


@dataclass(frozen=True, slots=True)
class Payload:
    """One whole encoded tensor (or shard) payload, reassembled."""

    tensor: int
    shard: ShardCoords
    codec: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Chunk:
    """One bounded, checksummed piece of a payload (``proto/chunks.py`` cuts and checks)."""

    kind: int
    round: int
    tensor: int
    shard: ShardCoords
    codec: str
    seq: int
    part: int
    parts: int
    data: bytes
    crc32: int


# ---- agent to coordinator ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    cloud: str
    name: str
    task: str
    tensors: list[TensorInfo]
    tp: int
    codecs: tuple[str, ...]
    last_round: int
    weights_digest: str
    exchanges: tuple[str, ...]
    max_streams: int = 0
    """Connections it can stripe its session over (0, 1: none; docs/striping.md)."""


@dataclass(frozen=True, slots=True)
class ExchangeTiming:
    """One round's exchange as the agent timed it, on its own clock (docs/striping.md)."""

    round: int
    up_s: float
    """Its contribution sent -> its receipt arrived."""
    down_s: float
    """The aggregate's first chunk arrived -> its round end arrived."""
    codec_s: float = 0.0
    """Encoding the contribution."""
    streams: int = 1
    """Connections the session striped over."""


@dataclass(frozen=True, slots=True)
class Announce:
    """A contribution's header: its round, how many chunks follow, and its accounting."""

    round: int
    chunks: int
    samples: int
    loss: float = 0.0
    train_s: float = 0.0
    raw_bytes: int = 0
    timing: ExchangeTiming | None = None
    """The agent's last exchange, as it timed it (efficiency only)."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    sent_ns: int = 0
    echo_ns: int = 0
    rtt_ms: float = 0.0
    probes_settled: int = 0
    probes_lost: int = 0
    received: int = 0
    """Striped sessions: every position up to this one has arrived (proto/stripes.py)."""


AgentMessage = Hello | Announce | Chunk | Heartbeat

# ---- coordinator to agent ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeOffer:
    """The loss probe a welcome offers: where to send, and the session's credentials."""

    port: int
    key: bytes
    probe_id: bytes
    interval_ms: int


@dataclass(frozen=True, slots=True)
class Welcome:
    round: int
    weights_follow: bool
    codec: str
    codec_params: str
    max_chunk_bytes: int
    heartbeat_ms: int
    identity: str
    exchange: str
    sgd_lr: float
    sgd_momentum: float
    probe: ProbeOffer | None = None
    overlap: bool = False
    """Train round r+1 while round r's exchange is in flight (docs/wan.md#overlap)."""
    stripe_token: bytes = b""
    """Joins a Stripe call to this session (empty: the session does not stripe)."""
    streams: int = 0
    """Connections to stripe over, the primary included."""


@dataclass(frozen=True, slots=True)
class Receipt:
    round: int
    accepted: bool
    code: int = 0
    message: str = ""


@dataclass(frozen=True, slots=True)
class RoundEnd:
    round: int
    chunks: int
    weights_digest: str
    contributors: int
    mean_loss: float
    codec: str
    codec_params: str
    final: bool
    streams: int = 0
    """Connections to stripe over from the next round (0: as now)."""


@dataclass(frozen=True, slots=True)
class WeightsEnd:
    round: int
    chunks: int
    weights_digest: str
    final: bool


CoordinatorMessage = Welcome | Chunk | Receipt | RoundEnd | WeightsEnd | Heartbeat

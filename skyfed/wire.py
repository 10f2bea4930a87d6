"""The protocol's messages as plain dataclasses: what both ends work on, free of protobuf.

``proto/serde.py`` converts them to and from the generated messages; only it, the
coordinator's servicer and the agent's link touch protobuf. Field meanings are those of
``proto/federation.proto`` (see docs/protocol.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal, get_args

from skyfed.compression.frame import VERSION as FRAME_VERSION
from skyfed.errors import ProtocolError
from skyfed.fingerprint import TensorInfo

ExchangeKind = Literal["delta", "gradient"]
"""What a contribution can be (Hello.exchanges, Welcome.exchange): the change over local
optimizer steps, or a momentum-corrected gradient step (skyfed.agent.momentum)."""
EXCHANGES: tuple[str, ...] = get_args(ExchangeKind)

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
    RESIDUAL = 3
    """A replica's snapshot: the downlink's error-feedback residual (docs/failover.md)."""
    MOMENTUM = 4
    """A replica's snapshot: the outer optimizer's momentum."""


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
    term: int = 0
    """The leader's term on what a coordinator replica sends (0: an agent's chunk, or one
    coordinator's; docs/failover.md)."""


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
    local_steps: int = 0
    """Optimizer steps between its exchanges (0: not said, an agent from before the
    field); the link policy's long-phase rule reads it (docs/compression.md)."""
    frame_version: int = FRAME_VERSION
    """The payload frame it speaks (``compression/frame.py``; 0 on the wire: version 1,
    an agent from before the field)."""
    congestion_control: str = ""
    """Its TCP congestion control toward the coordinator (``bbr``; "": not said, an agent
    from before the field); the N policy reads it (``coordinator/streams.py``)."""
    dp: int = 0
    """Its data-parallel replicas (0: not said, an agent from before the field); ``tp``
    is the tensor-parallel ranks of each (docs/sites.md)."""
    last_error: str = ""
    """Why the site last stopped, if it failed and could not say so then (one printable
    line; "": nothing to tell)."""


@dataclass(frozen=True, slots=True)
class Leave:
    """The site goes down, and why (one printable line): a rank failed. The coordinator's
    status shows it until the site is back (docs/sites.md)."""

    reason: str


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
    """Chunks that follow; 0: streamed, the count comes in its :class:`ContributionEnd`
    (the first chunks leave before the last tensor is encoded, docs/scale.md, Streams)."""
    samples: int
    loss: float | None = 0.0
    """The mean loss of its local steps; None: not known (a script's phase may not say)."""
    train_s: float = 0.0
    raw_bytes: int = 0
    timing: ExchangeTiming | None = None
    """The agent's last exchange, as it timed it (efficiency only)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Named metrics the site reported since its last contribution (``skyfed.Site.report``;
    bounded by :func:`metrics_problem`)."""


@dataclass(frozen=True, slots=True)
class ContributionEnd:
    """Ends a streamed contribution (its header's ``chunks`` was 0): the chunks it sent."""

    round: int
    chunks: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    sent_ns: int = 0
    echo_ns: int = 0
    rtt_ms: float = 0.0
    probes_settled: int = 0
    probes_lost: int = 0
    received: int = 0
    """Striped sessions: every position up to this one has arrived (proto/stripes.py)."""


AgentMessage = Hello | Announce | Chunk | Heartbeat | ContributionEnd | Leave

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
    frame_version: int = FRAME_VERSION
    """The payload frame it speaks (0 on the wire: version 1, a coordinator from before
    the field)."""
    term: int = 0
    """The leader's term (docs/failover.md); 0: one coordinator, no replicas."""


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
    term: int = 0
    """The leader's term (docs/failover.md); 0: one coordinator, no replicas."""


@dataclass(frozen=True, slots=True)
class WeightsEnd:
    round: int
    chunks: int
    weights_digest: str
    final: bool
    term: int = 0
    """The leader's term (docs/failover.md); 0: one coordinator, no replicas."""


CoordinatorMessage = Welcome | Chunk | Receipt | RoundEnd | WeightsEnd | Heartbeat


# ---- strings from a peer: which are accepted, and how a log line shows them ----------------


def is_token(text: str) -> bool:
    """A name, codec, digest or URI as a peer may send it: printable, with no space. No
    newline, tab, ESC or bidi control can reach a log line or a terminal through one."""
    return text.isprintable() and " " not in text


def is_text(text: str) -> bool:
    """Free text a peer may send (a task reference, a refusal's reason): printable,
    spaces allowed, no control character."""
    return text.isprintable()


def printable(text: str) -> str:
    """``text`` as a log line may show it: any control character escaped (``\\n``,
    ``\\x1b``), so a string from a peer cannot forge or colour a line."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


# ---- named metrics: what a site's report or an evaluation may carry -------------------------

MAX_METRICS = 16
"""Named metrics one report may carry: a site's (``skyfed.Site.report``) or an evaluation's."""
MAX_METRIC_NAME = 64
"""Characters of a metric's name."""
METRIC_BOUND = 1e30
"""A metric's value is finite and within this magnitude."""


def metrics_problem(metrics: Mapping[str, float]) -> str | None:
    """Why ``metrics`` cannot travel or be shown (too many, a name that is not a short
    printable token, a value that is not a finite number), or None: the one rule for a
    site's reports, an evaluation's results and the wire (docs/own-loop.md)."""
    if len(metrics) > MAX_METRICS:
        return f"{len(metrics)} metrics, at most {MAX_METRICS}"
    for name, value in metrics.items():
        if not isinstance(name, str) or not name or len(name) > MAX_METRIC_NAME:
            return f"metric name {str(name)[:80]!r} must be 1..{MAX_METRIC_NAME} characters"
        if not is_token(name):
            return f"metric name {printable(name)!r} must be printable with no space"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"metric {name!r} is a {type(value).__name__}, not a number"
        if not (math.isfinite(value) and abs(value) <= METRIC_BOUND):
            return f"metric {name!r} = {value!r} must be finite, within +-{METRIC_BOUND:g}"
    return None


def valid_metrics(metrics: Mapping[str, object]) -> tuple[dict[str, float], list[str]]:
    """The entries of ``metrics`` that may travel (the first ``MAX_METRICS`` that keep
    :func:`metrics_problem`'s rules), and why each other one was left out."""
    kept: dict[str, float] = {}
    dropped: list[str] = []
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            dropped.append(f"metric {str(name)[:80]!r} is a {type(value).__name__}, not a number")
            continue
        problem = metrics_problem({name: float(value)})
        if problem is None and len(kept) == MAX_METRICS:
            problem = f"metric {name!r}: more than {MAX_METRICS} metrics"
        if problem is not None:
            dropped.append(problem)
            continue
        kept[name] = float(value)
    return kept, dropped


# ---- coordinator replicas: a standby following the leader (docs/failover.md) ---------------


@dataclass(frozen=True, slots=True)
class ReplicaHello:
    """A standby's first message on ``Replicate``: where its state stands."""

    replica: str
    term: int
    """The highest leader's term it has seen."""
    round: int
    """The last round its state holds (-1: the initial weights)."""
    weights_digest: str
    spec_digest: str
    snapshot: bool = False
    """It asks for a snapshot: its state fell out of step with the leader's."""


@dataclass(frozen=True, slots=True)
class ReplicaAck:
    """A round the standby closed as the leader did, and its weights after it."""

    term: int
    round: int
    weights_digest: str


ReplicaMessage = ReplicaHello | ReplicaAck


@dataclass(frozen=True, slots=True)
class Following:
    """The leader's answer to a hello: the open round, and whether a snapshot comes first."""

    term: int
    round: int
    snapshot: bool


@dataclass(frozen=True, slots=True)
class Forward:
    """One payload a contribution staged at the leader; its ``chunks`` chunks follow."""

    term: int
    round: int
    contribution: int
    """Numbers the contribution within its round."""
    key: str
    """The contributor's identity URI: it orders the mean."""
    samples: int
    chunks: int


@dataclass(frozen=True, slots=True)
class RoundClose:
    """The leader closes a round: the standby closes its own with exactly these."""

    term: int
    round: int
    codec: str
    codec_since: int
    """The round the downlink's codec run started (Top-k's warm-up counts from it)."""
    local_steps: int
    contributions: tuple[int, ...]
    """The committed contributions; every other one of the round is withdrawn."""


@dataclass(frozen=True, slots=True)
class SnapshotEnd:
    """Ends a snapshot: the leader's state after ``round`` (``Model.checkpoint``)."""

    term: int
    round: int
    chunks: int
    weights_digest: str
    residual_digest: str
    """"": no residual held."""
    momentum_digest: str
    """"": no momentum held."""
    norms: tuple[float, ...]
    codec: str
    codec_since: int


LeaderMessage = Following | Chunk | Forward | RoundClose | SnapshotEnd


# ---- bounds: every field of every agent message, checked once as it leaves serde ----------
# A field is only ever used after these pass (docs/security.md, "Bounded messages"), so no
# later sum, counter or allocation can overflow or be steered by a value out of range.

MAX_ROUND = 1 << 53
"""Rounds are int64 on the wire; no federation runs 2^53 rounds, and sums stay exact."""
MAX_SAMPLES = 1 << 24
"""The largest ``samples`` a contribution may claim (the coordinator caps weights further)."""
MAX_RAW_BYTES = 1 << 48
"""A contribution's float32 bytes before compression: 256 TiB is beyond any model."""
MAX_TRAIN_S = 1e7
"""About 115 days of local compute per round."""
MAX_RTT_MS = 3.6e6
MAX_PROBES = 1 << 48
MAX_TEXT = 256
"""Characters of any free-text field (task, codec, dtype, digest, tensor name)."""
MAX_TENSORS = 1 << 17
MAX_DIMS = 8
MAX_DIM = 1 << 40
MAX_TP = 4096
MAX_ERROR = 512
"""Characters of a site's failure reason (``Hello.last_error``, ``Leave.reason``)."""
MAX_CHUNKS = 1 << 24
"""Chunks of one contribution (16 TB at the 1 MiB default chunk)."""
MAX_LIST = 16
"""Entries of ``codecs`` and ``exchanges``."""
MAX_LOCAL_STEPS = 1 << 20
"""An agent's local steps per round (a million: days of local training on a fast site)."""


def _bound(ok: bool, field: str, value: object, what: str) -> None:
    if not ok:
        shown = repr(value)
        raise ProtocolError(f"{field}={shown[:80]} is out of bounds: must be {what}")


def _int_in(field: str, value: int, lo: int, hi: int) -> None:
    _bound(lo <= value <= hi, field, value, f"in [{lo}, {hi}]")


def _finite_in(field: str, value: float, lo: float, hi: float) -> None:
    _bound(math.isfinite(value) and lo <= value <= hi, field, value, f"finite, in [{lo}, {hi}]")


def _text(field: str, value: str, limit: int = MAX_TEXT) -> None:
    """A token: a name, codec, digest (printable, no space; docs/security.md)."""
    _bound(len(value) <= limit, field, value, f"at most {limit} characters")
    _bound(is_token(value), field, value, "printable characters with no space")


def _free_text(field: str, value: str, limit: int = MAX_TEXT) -> None:
    """Free text: printable, spaces allowed, no control character."""
    _bound(len(value) <= limit, field, value, f"at most {limit} characters")
    _bound(is_text(value), field, value, "printable characters (no control character)")


def _texts(field: str, values: Sequence[str]) -> None:
    _bound(len(values) <= MAX_LIST, field, len(values), f"at most {MAX_LIST} entries")
    for v in values:
        _text(field, v, 32)


def _check_hello(m: Hello) -> None:
    _text("hello.cloud", m.cloud, 63)
    _text("hello.name", m.name, 63)
    _free_text("hello.task", m.task)
    _text("hello.weights_digest", m.weights_digest, 128)
    _int_in("hello.tp", m.tp, 0, MAX_TP)
    _int_in("hello.dp", m.dp, 0, MAX_TP)
    _free_text("hello.last_error", m.last_error, MAX_ERROR)
    _int_in("hello.last_round", m.last_round, -1, MAX_ROUND)
    _int_in("hello.local_steps", m.local_steps, 0, MAX_LOCAL_STEPS)
    _text("hello.congestion_control", m.congestion_control, 32)
    _texts("hello.codecs", m.codecs)
    _texts("hello.exchanges", m.exchanges)
    _bound(len(m.tensors) <= MAX_TENSORS, "hello.tensors", len(m.tensors), f"<= {MAX_TENSORS}")
    for t in m.tensors:
        _text("hello.tensors.name", t.name)
        _text("hello.tensors.dtype", t.dtype, 32)
        _bound(len(t.shape) <= MAX_DIMS, "hello.tensors.shape", t.shape, f"<= {MAX_DIMS} dims")
        for d in t.shape:
            _int_in("hello.tensors.shape", d, 0, MAX_DIM)


def _check_leave(m: Leave) -> None:
    _free_text("leave.reason", m.reason, MAX_ERROR)


def _check_announce(m: Announce) -> None:
    _int_in("contribution.round", m.round, 0, MAX_ROUND)
    _int_in("contribution.chunks", m.chunks, 0, MAX_CHUNKS)
    _int_in("contribution.samples", m.samples, 1, MAX_SAMPLES)
    if m.loss is not None:
        _finite_in("contribution.loss", m.loss, -1e30, 1e30)
    problem = metrics_problem(m.metrics)
    if problem is not None:
        raise ProtocolError(f"contribution.metrics is out of bounds: {problem}")
    _finite_in("contribution.train_s", m.train_s, 0.0, MAX_TRAIN_S)
    _int_in("contribution.raw_bytes", m.raw_bytes, 0, MAX_RAW_BYTES)


def _check_contribution_end(m: ContributionEnd) -> None:
    _int_in("contribution_end.round", m.round, 0, MAX_ROUND)
    _int_in("contribution_end.chunks", m.chunks, 1, MAX_CHUNKS)


def _check_chunk(m: Chunk) -> None:
    agent_kinds = (ChunkKind.GRADIENT, ChunkKind.AGGREGATE, ChunkKind.WEIGHTS)
    _bound(m.kind in agent_kinds, "chunk.kind", m.kind, "GRADIENT, AGGREGATE or WEIGHTS")
    _int_in("chunk.round", m.round, -1, MAX_ROUND)
    _int_in("chunk.term", m.term, 0, MAX_ROUND)
    _text("chunk.codec", m.codec, 32)
    if m.shard is not None:
        dim, offset, length = m.shard
        _int_in("chunk.shard.dim", dim, 0, MAX_DIMS - 1)
        _int_in("chunk.shard.offset", offset, 0, MAX_DIM)
        _int_in("chunk.shard.length", length, 0, MAX_DIM)


def _check_heartbeat(m: Heartbeat) -> None:
    _finite_in("heartbeat.rtt_ms", m.rtt_ms, 0.0, MAX_RTT_MS)
    _int_in("heartbeat.probes_settled", m.probes_settled, 0, MAX_PROBES)
    _int_in("heartbeat.probes_lost", m.probes_lost, 0, m.probes_settled)


MAX_CONTRIBUTIONS = 1 << 16
"""Contributions a replica's round close may name (far beyond any federation's members)."""
MAX_NORMS = 1024
"""Norms a snapshot's clipping window may hold (``coordinator/robust.py`` keeps 32)."""


def _check_replica_hello(m: ReplicaHello) -> None:
    _text("hello.replica", m.replica, 63)
    _int_in("hello.term", m.term, 0, MAX_ROUND)
    _int_in("hello.round", m.round, -1, MAX_ROUND)
    _text("hello.weights_digest", m.weights_digest, 128)
    _text("hello.spec_digest", m.spec_digest, 128)


def _check_replica_ack(m: ReplicaAck) -> None:
    _int_in("ack.term", m.term, 0, MAX_ROUND)
    _int_in("ack.round", m.round, 0, MAX_ROUND)
    _text("ack.weights_digest", m.weights_digest, 128)


def _check_following(m: Following) -> None:
    _int_in("following.term", m.term, 0, MAX_ROUND)
    _int_in("following.round", m.round, 0, MAX_ROUND)


def _check_forward(m: Forward) -> None:
    _int_in("forward.term", m.term, 0, MAX_ROUND)
    _int_in("forward.round", m.round, 0, MAX_ROUND)
    _int_in("forward.contribution", m.contribution, 0, MAX_CONTRIBUTIONS)
    _text("forward.key", m.key)
    _int_in("forward.samples", m.samples, 1, MAX_SAMPLES)
    _int_in("forward.chunks", m.chunks, 1, MAX_CHUNKS)


def _check_round_close(m: RoundClose) -> None:
    _int_in("round_close.term", m.term, 0, MAX_ROUND)
    _int_in("round_close.round", m.round, 0, MAX_ROUND)
    _text("round_close.codec", m.codec, 32)
    _int_in("round_close.codec_since", m.codec_since, 0, MAX_ROUND)
    _int_in("round_close.local_steps", m.local_steps, 0, MAX_LOCAL_STEPS)
    count = len(m.contributions)
    _bound(count <= MAX_CONTRIBUTIONS, "round_close.contributions", count, "<= 65536 entries")
    for c in m.contributions:
        _int_in("round_close.contributions", c, 0, MAX_CONTRIBUTIONS)


def _check_snapshot_end(m: SnapshotEnd) -> None:
    _int_in("snapshot_end.term", m.term, 0, MAX_ROUND)
    _int_in("snapshot_end.round", m.round, -1, MAX_ROUND)
    _int_in("snapshot_end.chunks", m.chunks, 0, MAX_CHUNKS)
    for name in ("weights_digest", "residual_digest", "momentum_digest"):
        _text(f"snapshot_end.{name}", getattr(m, name), 128)
    _bound(len(m.norms) <= MAX_NORMS, "snapshot_end.norms", len(m.norms), f"<= {MAX_NORMS}")
    for n in m.norms:
        _finite_in("snapshot_end.norms", n, 0.0, 1e300)
    _text("snapshot_end.codec", m.codec, 32)
    _int_in("snapshot_end.codec_since", m.codec_since, 0, MAX_ROUND)


def _check_leader_chunk(m: Chunk) -> None:
    _bound(m.kind in tuple(ChunkKind), "chunk.kind", m.kind, "a Chunk.Kind")
    _int_in("chunk.round", m.round, -1, MAX_ROUND)
    _int_in("chunk.term", m.term, 0, MAX_ROUND)
    _text("chunk.codec", m.codec, 32)


_REPLICA_CHECKS: dict[type, Callable[[Any], None]] = {
    ReplicaHello: _check_replica_hello,
    ReplicaAck: _check_replica_ack,
    Following: _check_following,
    Forward: _check_forward,
    RoundClose: _check_round_close,
    SnapshotEnd: _check_snapshot_end,
    Chunk: _check_leader_chunk,
}


def check_replica_message(m: ReplicaMessage | LeaderMessage) -> ReplicaMessage | LeaderMessage:
    """``m`` (either direction of ``Replicate``) if every field is within its bound; else
    ProtocolError naming the field: a replica's peer is bounded like an agent."""
    _REPLICA_CHECKS[type(m)](m)
    return m


_CHECKS: dict[type, Callable[[Any], None]] = {
    Hello: _check_hello,
    Announce: _check_announce,
    Chunk: _check_chunk,
    Heartbeat: _check_heartbeat,
    ContributionEnd: _check_contribution_end,
    Leave: _check_leave,
}


def check_agent_message(m: AgentMessage) -> AgentMessage:
    """``m`` if every field is within its bound; else ProtocolError naming the field."""
    _CHECKS[type(m)](m)
    return m


# ---- what an agent accepts: the strings of a coordinator's message ------------------------
# Its numbers are checked where they are used; its strings are logged and shown, so they
# are held to the same characters as an agent's.

MAX_URI = 2048
"""A SPIFFE ID's most characters."""
MAX_MESSAGE = 4096
"""A refusal's reason, or a codec's parameters as JSON."""


def _check_coordinator_strings(m: CoordinatorMessage) -> None:
    if isinstance(m, Welcome):
        _text("welcome.codec", m.codec, 32)
        _free_text("welcome.codec_params", m.codec_params, MAX_MESSAGE)
        _text("welcome.identity", m.identity, MAX_URI)
        _text("welcome.exchange", m.exchange, 32)
    elif isinstance(m, Receipt):
        _free_text("receipt.message", m.message, MAX_MESSAGE)
    elif isinstance(m, RoundEnd):
        _text("round_end.codec", m.codec, 32)
        _free_text("round_end.codec_params", m.codec_params, MAX_MESSAGE)
        _text("round_end.weights_digest", m.weights_digest, 128)
    elif isinstance(m, WeightsEnd):
        _text("weights_end.weights_digest", m.weights_digest, 128)
    elif isinstance(m, Chunk):
        _text("chunk.codec", m.codec, 32)


def check_coordinator_message(m: CoordinatorMessage) -> CoordinatorMessage:
    """``m`` if every string in it is printable and bounded; else ProtocolError."""
    _check_coordinator_strings(m)
    return m

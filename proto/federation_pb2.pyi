from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorSpec(_message.Message):
    __slots__ = ("name", "shape", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ...) -> None: ...

class Shard(_message.Message):
    __slots__ = ("dim", "offset", "length")
    DIM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    dim: int
    offset: int
    length: int
    def __init__(self, dim: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("cloud", "name", "task", "tensors", "tp", "codecs", "last_round", "weights_digest", "exchanges", "max_streams", "local_steps", "frame_version", "congestion_control", "dp", "last_error")
    CLOUD_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    CODECS_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    EXCHANGES_FIELD_NUMBER: _ClassVar[int]
    MAX_STREAMS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    FRAME_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONGESTION_CONTROL_FIELD_NUMBER: _ClassVar[int]
    DP_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    cloud: str
    name: str
    task: str
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    tp: int
    codecs: _containers.RepeatedScalarFieldContainer[str]
    last_round: int
    weights_digest: str
    exchanges: _containers.RepeatedScalarFieldContainer[str]
    max_streams: int
    local_steps: int
    frame_version: int
    congestion_control: str
    dp: int
    last_error: str
    def __init__(self, cloud: _Optional[str] = ..., name: _Optional[str] = ..., task: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., tp: _Optional[int] = ..., codecs: _Optional[_Iterable[str]] = ..., last_round: _Optional[int] = ..., weights_digest: _Optional[str] = ..., exchanges: _Optional[_Iterable[str]] = ..., max_streams: _Optional[int] = ..., local_steps: _Optional[int] = ..., frame_version: _Optional[int] = ..., congestion_control: _Optional[str] = ..., dp: _Optional[int] = ..., last_error: _Optional[str] = ...) -> None: ...

class Leave(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("round", "weights_follow", "codec", "codec_params", "max_chunk_bytes", "heartbeat_ms", "identity", "probe_port", "probe_key", "probe_interval_ms", "probe_id", "exchange", "sgd_lr", "sgd_momentum", "overlap", "stripe_token", "streams", "frame_version", "term")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FOLLOW_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    CODEC_PARAMS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    PROBE_PORT_FIELD_NUMBER: _ClassVar[int]
    PROBE_KEY_FIELD_NUMBER: _ClassVar[int]
    PROBE_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    SGD_LR_FIELD_NUMBER: _ClassVar[int]
    SGD_MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    STRIPE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    FRAME_VERSION_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    round: int
    weights_follow: bool
    codec: str
    codec_params: str
    max_chunk_bytes: int
    heartbeat_ms: int
    identity: str
    probe_port: int
    probe_key: bytes
    probe_interval_ms: int
    probe_id: bytes
    exchange: str
    sgd_lr: float
    sgd_momentum: float
    overlap: bool
    stripe_token: bytes
    streams: int
    frame_version: int
    term: int
    def __init__(self, round: _Optional[int] = ..., weights_follow: _Optional[bool] = ..., codec: _Optional[str] = ..., codec_params: _Optional[str] = ..., max_chunk_bytes: _Optional[int] = ..., heartbeat_ms: _Optional[int] = ..., identity: _Optional[str] = ..., probe_port: _Optional[int] = ..., probe_key: _Optional[bytes] = ..., probe_interval_ms: _Optional[int] = ..., probe_id: _Optional[bytes] = ..., exchange: _Optional[str] = ..., sgd_lr: _Optional[float] = ..., sgd_momentum: _Optional[float] = ..., overlap: _Optional[bool] = ..., stripe_token: _Optional[bytes] = ..., streams: _Optional[int] = ..., frame_version: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class Contribution(_message.Message):
    __slots__ = ("round", "chunks", "samples", "loss", "train_s", "raw_bytes", "timing", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_S_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    round: int
    chunks: int
    samples: int
    loss: float
    train_s: float
    raw_bytes: int
    timing: ExchangeTiming
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, round: _Optional[int] = ..., chunks: _Optional[int] = ..., samples: _Optional[int] = ..., loss: _Optional[float] = ..., train_s: _Optional[float] = ..., raw_bytes: _Optional[int] = ..., timing: _Optional[_Union[ExchangeTiming, _Mapping]] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ContributionEnd(_message.Message):
    __slots__ = ("round", "chunks")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    round: int
    chunks: int
    def __init__(self, round: _Optional[int] = ..., chunks: _Optional[int] = ...) -> None: ...

class ExchangeTiming(_message.Message):
    __slots__ = ("round", "up_s", "down_s", "codec_s", "streams")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    UP_S_FIELD_NUMBER: _ClassVar[int]
    DOWN_S_FIELD_NUMBER: _ClassVar[int]
    CODEC_S_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    round: int
    up_s: float
    down_s: float
    codec_s: float
    streams: int
    def __init__(self, round: _Optional[int] = ..., up_s: _Optional[float] = ..., down_s: _Optional[float] = ..., codec_s: _Optional[float] = ..., streams: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("kind", "round", "tensor", "shard", "codec", "seq", "part", "parts", "data", "crc32", "term")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        GRADIENT: _ClassVar[Chunk.Kind]
        AGGREGATE: _ClassVar[Chunk.Kind]
        WEIGHTS: _ClassVar[Chunk.Kind]
        RESIDUAL: _ClassVar[Chunk.Kind]
        MOMENTUM: _ClassVar[Chunk.Kind]
    GRADIENT: Chunk.Kind
    AGGREGATE: Chunk.Kind
    WEIGHTS: Chunk.Kind
    RESIDUAL: Chunk.Kind
    MOMENTUM: Chunk.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    kind: Chunk.Kind
    round: int
    tensor: int
    shard: Shard
    codec: str
    seq: int
    part: int
    parts: int
    data: bytes
    crc32: int
    term: int
    def __init__(self, kind: _Optional[_Union[Chunk.Kind, str]] = ..., round: _Optional[int] = ..., tensor: _Optional[int] = ..., shard: _Optional[_Union[Shard, _Mapping]] = ..., codec: _Optional[str] = ..., seq: _Optional[int] = ..., part: _Optional[int] = ..., parts: _Optional[int] = ..., data: _Optional[bytes] = ..., crc32: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class Receipt(_message.Message):
    __slots__ = ("round", "accepted", "code", "message")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    round: int
    accepted: bool
    code: int
    message: str
    def __init__(self, round: _Optional[int] = ..., accepted: _Optional[bool] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class RoundEnd(_message.Message):
    __slots__ = ("round", "chunks", "weights_digest", "contributors", "mean_loss", "codec", "final", "codec_params", "streams", "term")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    MEAN_LOSS_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    CODEC_PARAMS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    round: int
    chunks: int
    weights_digest: str
    contributors: int
    mean_loss: float
    codec: str
    final: bool
    codec_params: str
    streams: int
    term: int
    def __init__(self, round: _Optional[int] = ..., chunks: _Optional[int] = ..., weights_digest: _Optional[str] = ..., contributors: _Optional[int] = ..., mean_loss: _Optional[float] = ..., codec: _Optional[str] = ..., final: _Optional[bool] = ..., codec_params: _Optional[str] = ..., streams: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class WeightsEnd(_message.Message):
    __slots__ = ("round", "chunks", "weights_digest", "final", "term")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    round: int
    chunks: int
    weights_digest: str
    final: bool
    term: int
    def __init__(self, round: _Optional[int] = ..., chunks: _Optional[int] = ..., weights_digest: _Optional[str] = ..., final: _Optional[bool] = ..., term: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("sent_ns", "echo_ns", "rtt_ms", "probes_settled", "probes_lost", "received")
    SENT_NS_FIELD_NUMBER: _ClassVar[int]
    ECHO_NS_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    PROBES_SETTLED_FIELD_NUMBER: _ClassVar[int]
    PROBES_LOST_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    sent_ns: int
    echo_ns: int
    rtt_ms: float
    probes_settled: int
    probes_lost: int
    received: int
    def __init__(self, sent_ns: _Optional[int] = ..., echo_ns: _Optional[int] = ..., rtt_ms: _Optional[float] = ..., probes_settled: _Optional[int] = ..., probes_lost: _Optional[int] = ..., received: _Optional[int] = ...) -> None: ...

class StripeJoin(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: bytes
    def __init__(self, token: _Optional[bytes] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "contribution", "chunk", "heartbeat", "stripe_join", "contribution_end", "leave", "order")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STRIPE_JOIN_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTION_END_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    contribution: Contribution
    chunk: Chunk
    heartbeat: Heartbeat
    stripe_join: StripeJoin
    contribution_end: ContributionEnd
    leave: Leave
    order: int
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., contribution: _Optional[_Union[Contribution, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., stripe_join: _Optional[_Union[StripeJoin, _Mapping]] = ..., contribution_end: _Optional[_Union[ContributionEnd, _Mapping]] = ..., leave: _Optional[_Union[Leave, _Mapping]] = ..., order: _Optional[int] = ...) -> None: ...

class CoordinatorMessage(_message.Message):
    __slots__ = ("welcome", "chunk", "receipt", "round_end", "weights_end", "heartbeat", "order")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    ROUND_END_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_END_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    chunk: Chunk
    receipt: Receipt
    round_end: RoundEnd
    weights_end: WeightsEnd
    heartbeat: Heartbeat
    order: int
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., receipt: _Optional[_Union[Receipt, _Mapping]] = ..., round_end: _Optional[_Union[RoundEnd, _Mapping]] = ..., weights_end: _Optional[_Union[WeightsEnd, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., order: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("windows",)
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    windows: bool
    def __init__(self, windows: _Optional[bool] = ...) -> None: ...

class LinkWindow(_message.Message):
    __slots__ = ("start_s", "rtt_ms", "jitter_ms", "probes", "probes_lost", "goodput_mbit")
    START_S_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    JITTER_MS_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    PROBES_LOST_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_MBIT_FIELD_NUMBER: _ClassVar[int]
    start_s: float
    rtt_ms: float
    jitter_ms: float
    probes: int
    probes_lost: int
    goodput_mbit: float
    def __init__(self, start_s: _Optional[float] = ..., rtt_ms: _Optional[float] = ..., jitter_ms: _Optional[float] = ..., probes: _Optional[int] = ..., probes_lost: _Optional[int] = ..., goodput_mbit: _Optional[float] = ...) -> None: ...

class AgentStatus(_message.Message):
    __slots__ = ("cloud", "name", "state", "last_round", "codec", "rtt_ms", "bytes_up", "bytes_down", "connected_s", "codec_switches", "refused", "loss_pct", "jitter_ms", "goodput_mbit", "windows", "raw_bytes_up", "raw_bytes_down", "streams", "stream_switches", "efficiency", "codec_params", "local_steps", "dp", "tp", "last_error", "metrics", "metrics_round")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CLOUD_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    BYTES_UP_FIELD_NUMBER: _ClassVar[int]
    BYTES_DOWN_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_S_FIELD_NUMBER: _ClassVar[int]
    CODEC_SWITCHES_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    LOSS_PCT_FIELD_NUMBER: _ClassVar[int]
    JITTER_MS_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_MBIT_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_UP_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_DOWN_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    STREAM_SWITCHES_FIELD_NUMBER: _ClassVar[int]
    EFFICIENCY_FIELD_NUMBER: _ClassVar[int]
    CODEC_PARAMS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    DP_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    METRICS_ROUND_FIELD_NUMBER: _ClassVar[int]
    cloud: str
    name: str
    state: str
    last_round: int
    codec: str
    rtt_ms: float
    bytes_up: int
    bytes_down: int
    connected_s: float
    codec_switches: int
    refused: int
    loss_pct: float
    jitter_ms: float
    goodput_mbit: float
    windows: _containers.RepeatedCompositeFieldContainer[LinkWindow]
    raw_bytes_up: int
    raw_bytes_down: int
    streams: int
    stream_switches: int
    efficiency: LinkEfficiency
    codec_params: str
    local_steps: int
    dp: int
    tp: int
    last_error: str
    metrics: _containers.ScalarMap[str, float]
    metrics_round: int
    def __init__(self, cloud: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., last_round: _Optional[int] = ..., codec: _Optional[str] = ..., rtt_ms: _Optional[float] = ..., bytes_up: _Optional[int] = ..., bytes_down: _Optional[int] = ..., connected_s: _Optional[float] = ..., codec_switches: _Optional[int] = ..., refused: _Optional[int] = ..., loss_pct: _Optional[float] = ..., jitter_ms: _Optional[float] = ..., goodput_mbit: _Optional[float] = ..., windows: _Optional[_Iterable[_Union[LinkWindow, _Mapping]]] = ..., raw_bytes_up: _Optional[int] = ..., raw_bytes_down: _Optional[int] = ..., streams: _Optional[int] = ..., stream_switches: _Optional[int] = ..., efficiency: _Optional[_Union[LinkEfficiency, _Mapping]] = ..., codec_params: _Optional[str] = ..., local_steps: _Optional[int] = ..., dp: _Optional[int] = ..., tp: _Optional[int] = ..., last_error: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., metrics_round: _Optional[int] = ...) -> None: ...

class LinkEfficiency(_message.Message):
    __slots__ = ("round", "cloud", "name", "exchange_s", "floor_s", "ratio", "rtt_ms", "rate_mbit", "goodput_mbit", "streams", "limit")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CLOUD_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_S_FIELD_NUMBER: _ClassVar[int]
    FLOOR_S_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    RATE_MBIT_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_MBIT_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    round: int
    cloud: str
    name: str
    exchange_s: float
    floor_s: float
    ratio: float
    rtt_ms: float
    rate_mbit: float
    goodput_mbit: float
    streams: int
    limit: str
    def __init__(self, round: _Optional[int] = ..., cloud: _Optional[str] = ..., name: _Optional[str] = ..., exchange_s: _Optional[float] = ..., floor_s: _Optional[float] = ..., ratio: _Optional[float] = ..., rtt_ms: _Optional[float] = ..., rate_mbit: _Optional[float] = ..., goodput_mbit: _Optional[float] = ..., streams: _Optional[int] = ..., limit: _Optional[str] = ...) -> None: ...

class RoundStat(_message.Message):
    __slots__ = ("round", "duration_s", "train_s", "contributors", "mean_loss", "bytes_up", "bytes_down", "raw_bytes_up", "raw_bytes_down", "downlink_codec", "wall_s", "links")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    TRAIN_S_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    MEAN_LOSS_FIELD_NUMBER: _ClassVar[int]
    BYTES_UP_FIELD_NUMBER: _ClassVar[int]
    BYTES_DOWN_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_UP_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_DOWN_FIELD_NUMBER: _ClassVar[int]
    DOWNLINK_CODEC_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    round: int
    duration_s: float
    train_s: float
    contributors: int
    mean_loss: float
    bytes_up: int
    bytes_down: int
    raw_bytes_up: int
    raw_bytes_down: int
    downlink_codec: str
    wall_s: float
    links: _containers.RepeatedCompositeFieldContainer[LinkEfficiency]
    def __init__(self, round: _Optional[int] = ..., duration_s: _Optional[float] = ..., train_s: _Optional[float] = ..., contributors: _Optional[int] = ..., mean_loss: _Optional[float] = ..., bytes_up: _Optional[int] = ..., bytes_down: _Optional[int] = ..., raw_bytes_up: _Optional[int] = ..., raw_bytes_down: _Optional[int] = ..., downlink_codec: _Optional[str] = ..., wall_s: _Optional[float] = ..., links: _Optional[_Iterable[_Union[LinkEfficiency, _Mapping]]] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("round", "agents", "weights_digest", "uptime_s", "rounds", "finished", "exchange", "rounds_planned", "min_agents", "refusals", "checkpoints", "checkpoint_s", "eval_round", "eval_loss", "eval_metrics", "replicas")
    class RefusalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class EvalMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ROUND_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_PLANNED_FIELD_NUMBER: _ClassVar[int]
    MIN_AGENTS_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_S_FIELD_NUMBER: _ClassVar[int]
    EVAL_ROUND_FIELD_NUMBER: _ClassVar[int]
    EVAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    EVAL_METRICS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    round: int
    agents: _containers.RepeatedCompositeFieldContainer[AgentStatus]
    weights_digest: str
    uptime_s: float
    rounds: _containers.RepeatedCompositeFieldContainer[RoundStat]
    finished: bool
    exchange: str
    rounds_planned: int
    min_agents: int
    refusals: _containers.ScalarMap[str, int]
    checkpoints: int
    checkpoint_s: float
    eval_round: int
    eval_loss: float
    eval_metrics: _containers.ScalarMap[str, float]
    replicas: ReplicaSet
    def __init__(self, round: _Optional[int] = ..., agents: _Optional[_Iterable[_Union[AgentStatus, _Mapping]]] = ..., weights_digest: _Optional[str] = ..., uptime_s: _Optional[float] = ..., rounds: _Optional[_Iterable[_Union[RoundStat, _Mapping]]] = ..., finished: _Optional[bool] = ..., exchange: _Optional[str] = ..., rounds_planned: _Optional[int] = ..., min_agents: _Optional[int] = ..., refusals: _Optional[_Mapping[str, int]] = ..., checkpoints: _Optional[int] = ..., checkpoint_s: _Optional[float] = ..., eval_round: _Optional[int] = ..., eval_loss: _Optional[float] = ..., eval_metrics: _Optional[_Mapping[str, float]] = ..., replicas: _Optional[_Union[ReplicaSet, _Mapping]] = ...) -> None: ...

class ReplicaSet(_message.Message):
    __slots__ = ("replica", "leading", "term", "leader", "leader_address", "members", "failovers", "released", "alone")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    LEADING_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    FAILOVERS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    ALONE_FIELD_NUMBER: _ClassVar[int]
    replica: str
    leading: bool
    term: int
    leader: str
    leader_address: str
    members: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    failovers: _containers.RepeatedCompositeFieldContainer[Failover]
    released: int
    alone: bool
    def __init__(self, replica: _Optional[str] = ..., leading: _Optional[bool] = ..., term: _Optional[int] = ..., leader: _Optional[str] = ..., leader_address: _Optional[str] = ..., members: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ..., failovers: _Optional[_Iterable[_Union[Failover, _Mapping]]] = ..., released: _Optional[int] = ..., alone: _Optional[bool] = ...) -> None: ...

class ReplicaHello(_message.Message):
    __slots__ = ("replica", "term", "round", "weights_digest", "spec_digest", "snapshot")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SPEC_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    replica: str
    term: int
    round: int
    weights_digest: str
    spec_digest: str
    snapshot: bool
    def __init__(self, replica: _Optional[str] = ..., term: _Optional[int] = ..., round: _Optional[int] = ..., weights_digest: _Optional[str] = ..., spec_digest: _Optional[str] = ..., snapshot: _Optional[bool] = ...) -> None: ...

class ReplicaAck(_message.Message):
    __slots__ = ("term", "round", "weights_digest")
    TERM_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    term: int
    round: int
    weights_digest: str
    def __init__(self, term: _Optional[int] = ..., round: _Optional[int] = ..., weights_digest: _Optional[str] = ...) -> None: ...

class ReplicaMessage(_message.Message):
    __slots__ = ("hello", "ack")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    hello: ReplicaHello
    ack: ReplicaAck
    def __init__(self, hello: _Optional[_Union[ReplicaHello, _Mapping]] = ..., ack: _Optional[_Union[ReplicaAck, _Mapping]] = ...) -> None: ...

class Following(_message.Message):
    __slots__ = ("term", "round", "snapshot")
    TERM_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    term: int
    round: int
    snapshot: bool
    def __init__(self, term: _Optional[int] = ..., round: _Optional[int] = ..., snapshot: _Optional[bool] = ...) -> None: ...

class Forward(_message.Message):
    __slots__ = ("term", "round", "contribution", "key", "samples", "chunks")
    TERM_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    term: int
    round: int
    contribution: int
    key: str
    samples: int
    chunks: int
    def __init__(self, term: _Optional[int] = ..., round: _Optional[int] = ..., contribution: _Optional[int] = ..., key: _Optional[str] = ..., samples: _Optional[int] = ..., chunks: _Optional[int] = ...) -> None: ...

class RoundClose(_message.Message):
    __slots__ = ("term", "round", "codec", "codec_since", "local_steps", "contributions")
    TERM_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    CODEC_SINCE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    term: int
    round: int
    codec: str
    codec_since: int
    local_steps: int
    contributions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, term: _Optional[int] = ..., round: _Optional[int] = ..., codec: _Optional[str] = ..., codec_since: _Optional[int] = ..., local_steps: _Optional[int] = ..., contributions: _Optional[_Iterable[int]] = ...) -> None: ...

class SnapshotEnd(_message.Message):
    __slots__ = ("term", "round", "chunks", "weights_digest", "residual_digest", "momentum_digest", "norms", "codec", "codec_since")
    TERM_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    RESIDUAL_DIGEST_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_DIGEST_FIELD_NUMBER: _ClassVar[int]
    NORMS_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    CODEC_SINCE_FIELD_NUMBER: _ClassVar[int]
    term: int
    round: int
    chunks: int
    weights_digest: str
    residual_digest: str
    momentum_digest: str
    norms: _containers.RepeatedScalarFieldContainer[float]
    codec: str
    codec_since: int
    def __init__(self, term: _Optional[int] = ..., round: _Optional[int] = ..., chunks: _Optional[int] = ..., weights_digest: _Optional[str] = ..., residual_digest: _Optional[str] = ..., momentum_digest: _Optional[str] = ..., norms: _Optional[_Iterable[float]] = ..., codec: _Optional[str] = ..., codec_since: _Optional[int] = ...) -> None: ...

class LeaderMessage(_message.Message):
    __slots__ = ("following", "chunk", "forward", "round_close", "snapshot_end")
    FOLLOWING_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    FORWARD_FIELD_NUMBER: _ClassVar[int]
    ROUND_CLOSE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_END_FIELD_NUMBER: _ClassVar[int]
    following: Following
    chunk: Chunk
    forward: Forward
    round_close: RoundClose
    snapshot_end: SnapshotEnd
    def __init__(self, following: _Optional[_Union[Following, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., forward: _Optional[_Union[Forward, _Mapping]] = ..., round_close: _Optional[_Union[RoundClose, _Mapping]] = ..., snapshot_end: _Optional[_Union[SnapshotEnd, _Mapping]] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("name", "address", "state", "round", "lag")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    state: str
    round: int
    lag: int
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[str] = ..., round: _Optional[int] = ..., lag: _Optional[int] = ...) -> None: ...

class Failover(_message.Message):
    __slots__ = ("term", "replica", "previous", "cause", "duration_s", "round", "lost_rounds", "at_unix_s")
    TERM_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LOST_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    term: int
    replica: str
    previous: str
    cause: str
    duration_s: float
    round: int
    lost_rounds: int
    at_unix_s: float
    def __init__(self, term: _Optional[int] = ..., replica: _Optional[str] = ..., previous: _Optional[str] = ..., cause: _Optional[str] = ..., duration_s: _Optional[float] = ..., round: _Optional[int] = ..., lost_rounds: _Optional[int] = ..., at_unix_s: _Optional[float] = ...) -> None: ...

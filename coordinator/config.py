"""The coordinator's configuration, by concern: a section per part of the service
(transport, rounds, robustness, checkpoints, metrics, the link policy, replicas), each a
dataclass validated on construction. TOML names the sections (``[rounds] quorum = 3``);
flags, environment variables and :meth:`CoordinatorConfig.from_flat` name options flat
(``--quorum 3``, ``SKYFED_COORDINATOR_QUORUM``), and ``skyfed.config.sections`` routes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyfed.compression import codec_names
from skyfed.compression.monitor import MonitorConfig
from skyfed.compression.policy import PolicyConfig
from skyfed.config.checks import ConfigError, check_types, require
from skyfed.config.sections import from_flat, table
from skyfed.coordinator.outer import OuterKind, OuterSettings
from skyfed.coordinator.replicas.settings import ReplicasConfig, certificate_stem
from skyfed.coordinator.streams import StreamsConfig
from skyfed.proto.chunks import DEFAULT_MAX_CHUNK_BYTES
from skyfed.wire import ExchangeKind

COMPONENT = "coordinator"


def _require(section: str, ok: bool, key: str, value: object, what: str) -> None:
    require(COMPONENT, ok, key, value, what, section=section)


@dataclass(kw_only=True, slots=True)
class TransportConfig:
    """Where the coordinator listens, with which certificates, and how it bounds each
    peer's connections and messages. TOML: ``[transport]``."""

    listen: str = "0.0.0.0:7443"
    """Address to bind, HOST:PORT; port 0 picks a free one (see ``port_file``)."""
    certs: Path | None = None
    """A ``certs`` directory: ca.crt, crl.pem, coordinator.crt/.key. Explicit paths win."""
    ca: Path | None = None
    """CA certificate (PEM) that client certificates must chain to."""
    cert: Path | None = None
    """The coordinator's certificate (PEM)."""
    key: Path | None = None
    """The coordinator's private key (PEM, 0600)."""
    crl: Path | None = None
    """CRL written by ``certs revoke``; re-read when it changes."""
    port_file: Path | None = None
    """Write the bound port here once serving (for port 0)."""
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    """Largest chunk data accepted or sent, in bytes."""
    heartbeat_ms: int = 1000
    """Interval agents send heartbeats at."""
    liveness_timeout_s: float = 30.0
    """An agent silent (no message at all) this long is dropped from the round."""
    hello_timeout_s: float = 10.0
    """A call whose first message (a session's hello) is this late ends with
    DEADLINE_EXCEEDED."""
    max_streams_per_identity: int = 4
    """Open session streams one certificate identity may hold at once. A reconnect may
    briefly overlap its old stream, and striped connections of one session count as one;
    an identity over the limit is refused with RESOURCE_EXHAUSTED and logged, so it cannot
    fill the server's RPC slots (docs/security.md, "Stream limits")."""
    probe_port: int = 0
    """UDP port of the loss probe's echo on the listen host (0: any free one; -1: no probe)."""
    probe_interval_ms: int = 50
    """How often each agent sends a loss probe (about 48 bytes)."""
    link_rate_mbit: float = 0.0
    """The links' physical rate in Mbit/s, when the operator knows it (a provisioned
    interconnect, the lab's profile). Each exchange's floor in status assumes it; 0: the
    best goodput each link has shown, which understates a loss-limited link."""

    def __post_init__(self) -> None:
        check_types(self, COMPONENT, "transport")
        port = self.listen.rpartition(":")[2]
        ok = ":" in self.listen and port.isdigit() and int(port) < 65536
        _require("transport", ok, "listen", self.listen, "HOST:PORT with a port 0-65535 (0: any)")
        size = self.max_chunk_bytes
        _require("transport", 4096 <= size <= 4 << 20, "max_chunk_bytes", size, "4096..4 MiB")
        beat = self.heartbeat_ms
        _require("transport", beat >= 10, "heartbeat_ms", beat, ">= 10")
        live = self.liveness_timeout_s
        ok = live * 1000 > 2 * beat
        _require("transport", ok, "liveness_timeout_s", live, "longer than two heartbeats")
        hello = self.hello_timeout_s
        _require("transport", hello > 0, "hello_timeout_s", hello, "> 0")
        most = self.max_streams_per_identity
        _require("transport", most >= 1, "max_streams_per_identity", most, ">= 1")
        probe = self.probe_port
        _require("transport", -1 <= probe < 65536, "probe_port", probe, "-1..65535")
        every = self.probe_interval_ms
        _require("transport", every >= 5, "probe_interval_ms", every, ">= 5")
        rate = self.link_rate_mbit
        _require("transport", rate >= 0, "link_rate_mbit", rate, ">= 0")

    def resolve_certificates(self, stem: str) -> None:
        """Paths in ``certs`` for those not given (``stem``: this coordinator's files,
        ``coordinator`` or a replica's); the CA, certificate and key must then be known."""
        if self.certs is not None:
            self.ca = self.ca or self.certs / "ca.crt"
            self.cert = self.cert or self.certs / f"{stem}.crt"
            self.key = self.key or self.certs / f"{stem}.key"
            self.crl = self.crl or self.certs / "crl.pem"
        for name in ("ca", "cert", "key"):
            value = getattr(self, name)
            _require("transport", value is not None, name, value, "set (or give certs=DIR)")


@dataclass(kw_only=True, slots=True)
class RoundsConfig:
    """When rounds open and close, how many run, and what a round's exchange is and does.
    TOML: ``[rounds]``."""

    min_agents: int = 1
    """Agents that must be connected before round 0 opens (and, after a restart, before the
    first round opens)."""
    quorum: int = 1
    """The fewest contributions a round closes with, at most ``min_agents``. A round waits
    for them however long it takes (with fewer members connected, until more join); with
    at least ``quorum``, it closes when every member has contributed or once its deadline
    has passed."""
    round_deadline_s: float = 30.0
    """Seconds after a round's first committed contribution when a quorum is enough to
    close it. So the fastest site waits this long for stragglers, whatever the local phase
    lasts (a round of hundreds of local steps takes minutes)."""
    rounds: int = 0
    """Stop after this many rounds (0: run until stopped)."""
    final_wait_s: float = 30.0
    """How long the coordinator keeps serving after the last round, at most. It stops once
    every open stream has closed (each agent closes once it has applied that round; on a
    slow link the final broadcast takes a while) and every agent that ever contributed
    has had the final weights (one down at the end reconnects and fetches them)."""
    exchange: ExchangeKind = "delta"
    """What agents contribute each round (told in the welcome). ``delta``: the change over
    their ``local_steps`` steps of the task's optimizer (a pseudo-gradient). ``gradient``:
    Deep Gradient Compression's exchange, one momentum-SGD step per round with the velocity
    kept on each site before compression (momentum correction) and masked where Top-k sent
    (``skyfed.agent.momentum``); where Top-k loses least (docs/protocol.md)."""
    overlap: bool = False
    """Agents start round r+1's local steps while round r's exchange is in flight and
    apply round r's aggregate when those steps end (one-round-stale pseudo-gradients, as in
    Streaming DiLoCo): a round then costs about max(training, exchange) instead of their
    sum. Told to agents in the welcome; every agent applies the same updates at the same
    points, so all stay bit-identical. It costs loss per round, so an unset ``outer_lr``
    is halved with it (FedAvg at 0.5): at the full rate the stale steps overshot at 4 local
    steps (docs/wan.md#overlap) and at 128 (data-parallel's loss within 2x its steps on
    2 of 5 digits seeds and 0 of 2 chargpt seeds; at half 3 of 5 and 1 of 2; at a quarter
    1 of 5). At 128 local steps it still cost steps (chargpt 1.91x S against 1.31x
    without), more than the exchange it hides (docs/outer-optimizer.md)."""
    outer_optimizer: OuterKind = "sgd"
    """The coordinator's outer step on the round's mean pseudo-gradient (docs/protocol.md):
    ``sgd`` (with no momentum and ``outer_lr = 1``: federated averaging) or ``nesterov``
    (DiLoCo's outer Nesterov momentum). Measured on both tasks, FedAvg reached per-step
    data-parallel's loss in the fewest steps at every local phase tried (1-128 steps);
    DiLoCo's 0.7 / 0.9 overshot at 4-64 and diverged at 128, so with them unset an agent
    of 64 or more local steps is refused (docs/outer-optimizer.md). Its state is
    checkpointed; the broadcast carries the step it applied."""
    outer_lr: float | None = None
    """Outer step size; unset: 1.0 for ``sgd``, DiLoCo's 0.7 for ``nesterov``, each halved
    under ``overlap``."""
    outer_momentum: float | None = None
    """Outer momentum; unset: 0 for ``sgd``, DiLoCo's 0.9 for ``nesterov`` (which needs one
    in (0, 1); refused for agents of 64 or more local steps unless this and ``outer_lr``
    are set)."""
    sgd_lr: float = 0.1
    """``exchange = "gradient"``: the SGD step size."""
    sgd_momentum: float = 0.9
    """``exchange = "gradient"``: the SGD momentum."""

    @property
    def outer(self) -> OuterSettings:
        """The outer optimizer's settings, defaults resolved."""
        return OuterSettings.resolve(
            self.outer_optimizer, self.outer_lr, self.outer_momentum, overlap=self.overlap
        )

    def __post_init__(self) -> None:
        check_types(self, COMPONENT, "rounds")
        least, quorum = self.min_agents, self.quorum
        _require("rounds", least >= 1, "min_agents", least, ">= 1")
        _require("rounds", quorum >= 1, "quorum", quorum, ">= 1")
        # A quorum above the agents the first round waits for can leave every round
        # waiting for contributions that may never come.
        ok = quorum <= least
        _require(
            "rounds", ok, "quorum", quorum, f"<= min_agents ({least}): rounds could never close"
        )
        deadline = self.round_deadline_s
        _require("rounds", deadline > 0, "round_deadline_s", deadline, "> 0")
        _require("rounds", self.rounds >= 0, "rounds", self.rounds, ">= 0")
        _require("rounds", self.final_wait_s >= 0, "final_wait_s", self.final_wait_s, ">= 0")
        try:
            _ = self.outer  # resolves and checks the outer optimizer's options
        except ConfigError as exc:
            raise exc.within(COMPONENT, "rounds") from None
        _require("rounds", self.sgd_lr > 0, "sgd_lr", self.sgd_lr, "> 0")
        momentum = self.sgd_momentum
        _require("rounds", 0 <= momentum < 1, "sgd_momentum", momentum, "in [0, 1)")


@dataclass(kw_only=True, slots=True)
class RobustnessConfig:
    """How far one agent's contribution can move the mean (docs/security.md).
    TOML: ``[robustness]``."""

    max_samples: int = 65536
    """The most weight (``samples``) one contribution counts with in the mean. A larger
    claim is capped and logged. Set it to the largest honest site's samples per round
    (``local_steps`` x batch size) so no site outweighs that (docs/security.md)."""
    clip_norm_ratio: float = 4.0
    """Clip each update's L2 norm to this times the median of the recent accepted updates'
    norms (0: no clipping). An update past it is scaled down to that bound before it
    counts; it costs no memory, and its loss cost on the embedded task is in
    docs/security.md."""

    def __post_init__(self) -> None:
        check_types(self, COMPONENT, "robustness")
        most = self.max_samples
        _require("robustness", most >= 1, "max_samples", most, ">= 1")
        ratio = self.clip_norm_ratio
        ok = ratio == 0 or ratio >= 1
        _require("robustness", ok, "clip_norm_ratio", ratio, "0 (off) or >= 1")


@dataclass(kw_only=True, slots=True)
class CheckpointsConfig:
    """What the coordinator keeps on disk: round checkpoints, staged uplinks, the final
    weights. TOML: ``[checkpoints]``."""

    checkpoint_dir: Path | None = None
    """Where round checkpoints go; resumed from on start. None: no checkpoints."""
    stage_memory: float = 1.0
    """A round's staged uplinks held in memory at most, as a multiple of the model's float32
    bytes. Past it each dense payload that arrives waits for the close in an unlinked file
    in ``stage_dir`` instead (docs/scale.md, The aggregate), so the coordinator's memory
    stops growing with the number of agents. 1: FP16 from two agents stay in memory, a
    third spills. ``inf``: every payload in memory; 0: every dense payload of 16 KiB or
    more on disk."""
    stage_dir: Path | None = None
    """Where uplinks past ``stage_memory`` are staged; unset: ``checkpoint_dir``, else
    ``run_dir``, else the system's temporary directory. On a tmpfs it saves no memory."""
    export: Path | None = None
    """At the end of the run, write the final weights here as a plain ``state_dict`` (and
    its metadata as ``.json`` beside it)."""

    def __post_init__(self) -> None:
        check_types(self, COMPONENT, "checkpoints")
        memory = self.stage_memory
        _require("checkpoints", memory >= 0, "stage_memory", memory, ">= 0 (inf: no limit)")


@dataclass(kw_only=True, slots=True)
class MetricsConfig:
    """What the coordinator tells operators beside its log: the metrics port, the status
    file, the run directory, evaluations, TensorBoard. TOML: ``[metrics]``."""

    metrics_listen: str = ""
    """HOST:PORT of the plain-HTTP ``/metrics``, ``/healthz`` and ``/readyz`` port ("": off).
    Outside mTLS: loopback only unless ``metrics_public`` (docs/operations.md)."""
    metrics_public: bool = False
    """Allow ``metrics_listen`` on a non-loopback address (a pod IP for Kubernetes probes)."""
    run_dir: Path | None = None
    """The run directory: ``rounds.jsonl`` (one line per closed round, per evaluation and
    per round whose links were timed after it closed) and,
    unless ``status_file`` says otherwise, ``status.json``; ``skyfed report RUN_DIR`` plots
    it (docs/operations.md)."""
    status_file: Path | None = None
    """Rewrite the status (as JSON) here after every round and at exit."""
    eval_every: int = 5
    """Evaluate the canonical weights on the task's held-out data (its ``eval_metrics``, or
    its ``eval_loss``) every this many rounds and after the last, on a worker thread off
    the rounds' path (0: never)."""
    tensorboard: Path | None = None
    """Write TensorBoard scalars of every round here (needs the ``tensorboard`` extra)."""

    def __post_init__(self) -> None:
        check_types(self, COMPONENT, "metrics")
        _require("metrics", self.eval_every >= 0, "eval_every", self.eval_every, ">= 0")
        if self.metrics_listen:
            from skyfed.metrics.http import listen_problem  # its server's packages: when used

            problem = listen_problem(self.metrics_listen, public=self.metrics_public)
            _require("metrics", not problem, "metrics_listen", self.metrics_listen, problem)
        if self.run_dir is not None and self.status_file is None:
            self.status_file = self.run_dir / "status.json"


@dataclass(kw_only=True, slots=True)
class CoordinatorConfig:
    """Everything ``coordinator serve`` needs: the federation's task, seed and link codec,
    then a section per concern."""

    task: str = "chargpt"
    """Task whose model the federation trains (``chargpt`` or ``module:factory``)."""
    seed: int = 0
    """Seed of the initial weights and of the downlink's stochastic rounding (EC-SGD)."""
    codec: str = "auto"
    """Link codec: ``auto`` lets the link policy pick each link's codec from its measured
    RTT, loss and goodput; a codec's name (``fp16``, ``topk``, ``ecsgd``: any the registry
    holds) fixes it."""
    threads: int = 1
    """torch intra-op threads for the coordinator's tensor work (the mean, the downlink's
    encode, the payload checks). One: its work is already spread over threads of its own
    (a reader per session, the round's close, the digest pool, the checkpoint writer),
    and on a host whose cores are busy an intra-op worker that is not scheduled stalls
    every small kernel (docs/scale.md, CPU)."""
    transport: TransportConfig = field(default_factory=TransportConfig)
    """Listening, certificates, and the bounds on each peer's connections."""
    rounds: RoundsConfig = field(default_factory=RoundsConfig)
    """When rounds open and close, and what they exchange."""
    robustness: RobustnessConfig = field(default_factory=RobustnessConfig)
    """The bounds on one agent's weight and update."""
    checkpoints: CheckpointsConfig = field(default_factory=CheckpointsConfig)
    """Checkpoints, staged uplinks, the exported model."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """The metrics port, the status file, the run directory."""
    policy: PolicyConfig = field(
        default_factory=PolicyConfig,
        metadata=table(
            "its many thresholds live in the file; --policy sets its mode", policy="mode"
        ),
    )
    """The link policy: thresholds, dwell and codec parameters (docs/compression.md)."""
    monitor: MonitorConfig = field(
        default_factory=MonitorConfig,
        metadata=table("its windows are tuned in the file, not per run"),
    )
    """Measurement windows and smoothing of every link (docs/monitor.md)."""
    streams: StreamsConfig = field(
        default_factory=StreamsConfig,
        metadata=table(
            "its thresholds live in the file; --max-streams sets its max_streams",
            max_streams="max_streams",
        ),
    )
    """How many TCP connections each link's session stripes over, chosen per link
    (docs/striping.md)."""
    replicas: ReplicasConfig = field(default_factory=ReplicasConfig)
    """Coordinator replicas electing one leader through etcd (docs/failover.md)."""

    @classmethod
    def from_flat(cls, **options: Any) -> CoordinatorConfig:
        """A configuration from options named flat, as flags and environment variables
        name them (``quorum=3``, ``certs=DIR``); a section may also be given whole."""
        return from_flat(cls, COMPONENT, options)

    @property
    def spill_dir(self) -> Path | None:
        """Where staged uplinks past ``stage_memory`` go (None: the temporary directory)."""
        checkpoints = self.checkpoints
        return checkpoints.stage_dir or checkpoints.checkpoint_dir or self.metrics.run_dir

    def __post_init__(self) -> None:
        check_types(self, COMPONENT)
        codecs = ["auto", *codec_names()]
        require(COMPONENT, self.codec in codecs, "codec", self.codec, f"one of {codecs}")
        require(COMPONENT, self.threads >= 1, "threads", self.threads, ">= 1")
        if self.rounds.exchange == "gradient":
            self.policy = self.policy.for_gradient_exchange()
            bits = self.policy.ecsgd_bits
            what = "2 or 4 under exchange = gradient"
            require(COMPONENT, bits != 1, "ecsgd_bits", bits, what, section="policy")
        self.transport.resolve_certificates(certificate_stem(self.replicas.replica))

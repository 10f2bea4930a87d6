"""The coordinator's configuration: one dataclass, one TOML file, env and flags on top."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyfed.compression import codec_names
from skyfed.compression.monitor import MonitorConfig
from skyfed.compression.policy import PolicyConfig
from skyfed.coordinator.outer import OuterSettings
from skyfed.coordinator.replicas.settings import certificate_stem, check_replica_options
from skyfed.coordinator.streams import StreamsConfig
from skyfed.proto.chunks import DEFAULT_MAX_CHUNK_BYTES
from skyfed.validate import require
from skyfed.wire import EXCHANGES


@dataclass(kw_only=True, slots=True)
class CoordinatorConfig:
    """Everything ``coordinator serve`` needs. TOML keys are these field names."""

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
    task: str = "chargpt"
    """Task whose model the federation trains (``chargpt`` or ``module:factory``)."""
    seed: int = 0
    """Seed of the initial weights and of the downlink's stochastic rounding (EC-SGD)."""
    min_agents: int = 1
    """Agents that must be connected before round 0 opens (and, after a restart, before the
    first round opens)."""
    quorum: int = 1
    """The fewest contributions a round closes with: it waits for them however long it
    takes (with fewer members connected, until more join). With at least ``quorum``, a
    round closes when every member has contributed or once its deadline has passed."""
    round_deadline_s: float = 30.0
    """Seconds after a round's first committed contribution when a quorum is enough to
    close it: how long the fastest site waits for stragglers, whatever the local phase
    lasts (a round of hundreds of local steps takes minutes)."""
    rounds: int = 0
    """Stop after this many rounds (0: run until stopped)."""
    outer_optimizer: str = "sgd"
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
    max_samples: int = 65536
    """The most weight (``samples``) one contribution counts with in the mean; a larger
    claim is capped and logged. Set it to the largest honest site's samples per round
    (``local_steps`` x batch size) so no site outweighs that (docs/security.md)."""
    clip_norm_ratio: float = 4.0
    """An update whose L2 norm exceeds this times the median of the recent accepted
    updates' norms is scaled down to that bound before it counts (0: no clipping). Costs
    no memory; its loss cost on the embedded task is in docs/security.md."""
    exchange: str = "delta"
    """What agents contribute each round (told in the welcome). ``delta``: the change over
    their ``local_steps`` steps of the task's optimizer (a pseudo-gradient). ``gradient``:
    Deep Gradient Compression's exchange, one momentum-SGD step per round with the velocity
    kept on each site before compression (momentum correction) and masked where Top-k sent
    (``skyfed.agent.momentum``); where Top-k loses least (docs/protocol.md)."""
    sgd_lr: float = 0.1
    """``exchange = "gradient"``: the SGD step size."""
    sgd_momentum: float = 0.9
    """``exchange = "gradient"``: the SGD momentum."""
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
    codec: str = "auto"
    """Link codec: ``auto`` lets the link policy pick each link's codec from its measured
    RTT, loss and goodput; a codec name (fp32, fp16, bf16, topk, ecsgd) fixes it."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The link policy (TOML table ``[policy]``; a string names its ``mode``)."""
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    """Measurement windows and smoothing of every link (TOML table ``[monitor]``)."""
    streams: StreamsConfig = field(default_factory=StreamsConfig)
    """How many TCP connections each link's session stripes over, chosen per link
    (TOML table ``[streams]``; a number sets its ``max_streams``). See docs/striping.md."""
    link_rate_mbit: float = 0.0
    """The links' physical rate when the operator knows it (a provisioned interconnect,
    the lab's profile): the rate of each exchange's floor in status. 0: the best goodput
    each link has shown, which understates a loss-limited link."""
    probe_port: int = 0
    """UDP port of the loss probe's echo on the listen host (0: any free one; -1: no probe)."""
    probe_interval_ms: int = 50
    """How often each agent sends a loss probe (about 48 bytes)."""
    checkpoint_dir: Path | None = None
    """Where round checkpoints go; resumed from on start. None: no checkpoints."""
    stage_memory: float = 1.0
    """A round's staged uplinks held in memory at most, as a multiple of the model's float32
    bytes; past it each dense payload that arrives waits for the close in an unlinked file
    in ``stage_dir`` instead (docs/scale.md, The aggregate), so the coordinator's memory
    stops growing with the number of agents. 1: FP16 from two agents stay in memory, a
    third spills. ``inf``: every payload in memory; 0: every dense payload of 16 KiB or
    more on disk."""
    stage_dir: Path | None = None
    """Where uplinks past ``stage_memory`` are staged; unset: ``checkpoint_dir``, else
    ``run_dir``, else the system's temporary directory. On a tmpfs it saves no memory."""
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    """Largest chunk data accepted or sent, in bytes."""
    threads: int = 1
    """torch intra-op threads for the coordinator's tensor work (the mean, the downlink's
    encode, the payload checks). One: its work is already spread over threads of its own
    (a reader per session, the round's close, the digest pool, the checkpoint writer),
    and on a host whose cores are busy an intra-op worker that is not scheduled stalls
    every small kernel (docs/scale.md, CPU)."""
    heartbeat_ms: int = 1000
    """Interval agents send heartbeats at."""
    liveness_timeout_s: float = 30.0
    """An agent silent (no message at all) this long is dropped from the round."""
    final_wait_s: float = 30.0
    """After the last round, how long the coordinator keeps serving before it stops: until
    every open stream has closed (each agent closes once it has applied that round; on a
    slow link the final broadcast takes a while) and every agent that ever contributed
    has had the final weights (one down at the end reconnects and fetches them)."""
    max_streams_per_identity: int = 4
    """Open session streams one certificate identity may hold at once (a reconnect may
    briefly overlap its old stream; striped connections of one session count as one). One
    identity over the limit is refused with RESOURCE_EXHAUSTED and logged, so it cannot
    fill the server's RPC slots (docs/security.md, "Stream limits")."""
    hello_timeout_s: float = 10.0
    """A stream that sends no hello this long after opening ends with DEADLINE_EXCEEDED."""
    port_file: Path | None = None
    """Write the bound port here once serving (for port 0)."""
    status_file: Path | None = None
    """Rewrite the status (as JSON) here after every round and at exit."""
    run_dir: Path | None = None
    """The run directory: ``rounds.jsonl`` (one line per closed round, per evaluation and
    per round whose links were timed after it closed) and,
    unless ``status_file`` says otherwise, ``status.json``; ``skyfed report RUN_DIR`` plots
    it (docs/operations.md)."""
    eval_every: int = 5
    """Evaluate the canonical weights on the task's held-out data (its ``eval_metrics``, or
    its ``eval_loss``) every this many rounds and after the last, on a worker thread off
    the rounds' path (0: never)."""
    metrics_listen: str = ""
    """HOST:PORT of the plain-HTTP ``/metrics``, ``/healthz`` and ``/readyz`` port ("": off).
    Outside mTLS: loopback only unless ``metrics_public`` (docs/operations.md)."""
    metrics_public: bool = False
    """Allow ``metrics_listen`` on a non-loopback address (a pod IP for Kubernetes probes)."""
    export: Path | None = None
    """At the end of the run, write the final weights here as a plain ``state_dict`` (and
    its metadata as ``.json`` beside it)."""
    tensorboard: Path | None = None
    """Write TensorBoard scalars of every round here (needs the ``tensorboard`` extra)."""

    # ---- replicas (docs/failover.md; checked by coordinator/replicas/settings.py) ------
    replica: str = ""
    """This replica's name among the coordinator's replicas ("": one coordinator, no
    election). With ``etcd`` it campaigns for leadership; while another replica leads it
    serves as a standby, which answers agents with the leader's address. Its certificate
    in ``certs`` is ``coordinator-<replica>.crt`` (``certs issue coordinator --replica``)."""
    etcd: str = ""
    """The etcd cluster the replicas elect their leader through: comma-separated
    ``http(s)://HOST:PORT`` endpoints. Over https a replica shows etcd its own certificate
    (etcd trusts the federation's ``ca.crt``: ``--client-cert-auth``) and checks etcd's
    against ``etcd_ca``."""
    etcd_ca: Path | None = None
    """The CA etcd's server certificate chains to (https endpoints). Not the federation's
    CA by default: a certificate from it that a server may show is a coordinator's, and
    etcd is not one (docs/failover.md)."""
    advertise: str = ""
    """HOST:PORT agents dial to reach this replica, which standbys name to them ("": the
    ``listen`` address with its bound port)."""
    lease_ttl_s: int = 5
    """TTL of a replica's etcd lease, in seconds. A leader that cannot refresh its lease
    stops acting before it lapses; a standby leads once it has (a killed leader is
    replaced within about this long)."""
    etcd_prefix: str = "skyfed"
    """This federation's keys in etcd: one etcd may serve several federations."""
    replica_ack_timeout_s: float = 10.0
    """How long a leader waits for a following standby to hold a round before agents get
    its end; one that takes longer is marked behind and does not campaign until it has
    caught up (docs/failover.md)."""

    @property
    def spill_dir(self) -> Path | None:
        """Where staged uplinks past ``stage_memory`` go (None: the temporary directory)."""
        return self.stage_dir or self.checkpoint_dir or self.run_dir

    @property
    def outer(self) -> OuterSettings:
        """The outer optimizer's settings, defaults resolved."""
        return OuterSettings.resolve(
            self.outer_optimizer, self.outer_lr, self.outer_momentum, overlap=self.overlap
        )

    def __post_init__(self) -> None:
        require("coordinator", self.min_agents >= 1, "min_agents", self.min_agents, ">= 1")
        require("coordinator", self.quorum >= 1, "quorum", self.quorum, ">= 1")
        require(
            "coordinator",
            self.round_deadline_s > 0,
            "round_deadline_s",
            self.round_deadline_s,
            "> 0",
        )
        require("coordinator", self.rounds >= 0, "rounds", self.rounds, ">= 0")
        _ = self.outer  # resolves and checks the outer optimizer's options
        require("coordinator", self.max_samples >= 1, "max_samples", self.max_samples, ">= 1")
        require(
            "coordinator",
            self.clip_norm_ratio == 0 or self.clip_norm_ratio >= 1,
            "clip_norm_ratio",
            self.clip_norm_ratio,
            "0 (off) or >= 1",
        )
        require(
            "coordinator",
            self.exchange in EXCHANGES,
            "exchange",
            self.exchange,
            " or ".join(EXCHANGES),
        )
        require("coordinator", self.sgd_lr > 0, "sgd_lr", self.sgd_lr, "> 0")
        require(
            "coordinator",
            0 <= self.sgd_momentum < 1,
            "sgd_momentum",
            self.sgd_momentum,
            "in [0, 1)",
        )
        self.policy = _section(PolicyConfig, self.policy, "mode", "policy")
        self.monitor = _section(MonitorConfig, self.monitor, "window_s", "monitor")
        self.streams = _section(StreamsConfig, self.streams, "max_streams", "streams")
        rate = self.link_rate_mbit
        require("coordinator", rate >= 0, "link_rate_mbit", rate, ">= 0")
        if self.exchange == "gradient":
            self.policy = self.policy.for_gradient_exchange()
            bits = self.policy.ecsgd_bits
            require(
                "coordinator",
                bits != 1,
                "policy.ecsgd_bits",
                bits,
                "2 or 4 under exchange = gradient",
            )
        codecs = ["auto", *codec_names()]
        require("coordinator", self.codec in codecs, "codec", self.codec, f"one of {codecs}")
        require(
            "coordinator", -1 <= self.probe_port < 65536, "probe_port", self.probe_port, "-1..65535"
        )
        require(
            "coordinator",
            self.probe_interval_ms >= 5,
            "probe_interval_ms",
            self.probe_interval_ms,
            ">= 5",
        )
        require("coordinator", self.threads >= 1, "threads", self.threads, ">= 1")
        memory = self.stage_memory
        require("coordinator", memory >= 0, "stage_memory", memory, ">= 0 (inf: no limit)")
        require(
            "coordinator",
            4096 <= self.max_chunk_bytes <= 4 << 20,
            "max_chunk_bytes",
            self.max_chunk_bytes,
            "between 4096 and 4 MiB",
        )
        require("coordinator", self.heartbeat_ms >= 10, "heartbeat_ms", self.heartbeat_ms, ">= 10")
        require(
            "coordinator",
            self.liveness_timeout_s * 1000 > 2 * self.heartbeat_ms,
            "liveness_timeout_s",
            self.liveness_timeout_s,
            "longer than two heartbeats",
        )
        require(
            "coordinator",
            self.max_streams_per_identity >= 1,
            "max_streams_per_identity",
            self.max_streams_per_identity,
            ">= 1",
        )
        require(
            "coordinator", self.hello_timeout_s > 0, "hello_timeout_s", self.hello_timeout_s, "> 0"
        )
        require("coordinator", self.final_wait_s >= 0, "final_wait_s", self.final_wait_s, ">= 0")
        port = self.listen.rpartition(":")[2]
        require(
            "coordinator",
            ":" in self.listen and port.isdigit() and int(port) < 65536,
            "listen",
            self.listen,
            "HOST:PORT with a port 0-65535 (0: any free one)",
        )
        require("coordinator", self.eval_every >= 0, "eval_every", self.eval_every, ">= 0")
        if self.metrics_listen:
            from skyfed.metrics.http import parse_listen

            parse_listen(self.metrics_listen, public=self.metrics_public)
        if self.run_dir is not None and self.status_file is None:
            self.status_file = self.run_dir / "status.json"
        check_replica_options(self)
        if self.certs is not None:
            stem = certificate_stem(self.replica)
            self.ca = self.ca or self.certs / "ca.crt"
            self.cert = self.cert or self.certs / f"{stem}.crt"
            self.key = self.key or self.certs / f"{stem}.key"
            self.crl = self.crl or self.certs / "crl.pem"
        for name in ("ca", "cert", "key"):
            require(
                "coordinator",
                getattr(self, name) is not None,
                name,
                None,
                "set (or give certs=DIR)",
            )


def _section(cls: type, value: Any, scalar_key: str, section: str) -> Any:
    """A nested option: the dataclass itself, a TOML table of its fields, or one scalar."""
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        require("coordinator", not unknown, f"[{section}]", unknown, f"keys of {sorted(known)}")
        try:
            return cls(**value)
        except TypeError as exc:  # a value of the wrong type meeting a comparison
            raise ValueError(f"coordinator option [{section}]: {exc}") from exc
    kind = type(getattr(cls(), scalar_key))
    return cls(**{scalar_key: kind(value)})

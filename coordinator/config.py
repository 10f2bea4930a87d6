"""The coordinator's configuration: one dataclass, one TOML file, env and flags on top."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyfed.compression import codec_names
from skyfed.compression.monitor import MonitorConfig
from skyfed.compression.policy import PolicyConfig
from skyfed.coordinator.outer import OuterSettings
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
    """Agents that must be connected before round 0 opens."""
    quorum: int = 1
    """Contributions that let a round close once its deadline has passed."""
    round_deadline_s: float = 30.0
    """Seconds after a round opens when a quorum is enough to close it."""
    rounds: int = 0
    """Stop after this many rounds (0: run until stopped)."""
    outer_optimizer: str = "sgd"
    """The coordinator's outer step on the round's mean pseudo-gradient (docs/protocol.md):
    ``sgd`` (with no momentum and ``outer_lr = 1``: federated averaging) or ``nesterov``
    (DiLoCo's outer Nesterov momentum, which lets long local phases converge). Its state is
    checkpointed; the broadcast carries the step it applied."""
    outer_lr: float | None = None
    """Outer step size; unset: 1.0 for ``sgd``, DiLoCo's 0.7 for ``nesterov``."""
    outer_momentum: float | None = None
    """Outer momentum; unset: 0 for ``sgd``, DiLoCo's 0.9 for ``nesterov`` (which needs one
    in (0, 1))."""
    exchange: str = "delta"
    """What agents contribute each round (told in the welcome). ``delta``: the change over
    their ``local_steps`` steps of the task's optimizer (a pseudo-gradient). ``gradient``:
    Deep Gradient Compression's exchange, one momentum-SGD step per round with the velocity
    kept on each site before compression (momentum correction) and masked where Top-k sent
    (``skyfed.agent.momentum``); where Top-k loses least (README, Figures)."""
    sgd_lr: float = 0.1
    """``exchange = "gradient"``: the SGD step size."""
    sgd_momentum: float = 0.9
    """``exchange = "gradient"``: the SGD momentum."""
    overlap: bool = False
    """Agents start round r+1's local steps while round r's exchange is in flight and
    apply round r's aggregate when those steps end (one-round-stale pseudo-gradients, as in
    Streaming DiLoCo): a round then costs about max(training, exchange) instead of their
    sum. Told to agents in the welcome; every agent applies the same updates at the same
    points, so all stay bit-identical. It costs loss per round: with it, halve
    ``outer_lr`` (measured in docs/wan.md#overlap)."""
    codec: str = "auto"
    """Link codec: ``auto`` lets the link policy pick each link's codec from its measured
    RTT, loss and goodput; a codec name (fp32, fp16, bf16, topk, ecsgd) fixes it."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The link policy (TOML table ``[policy]``; a string names its ``mode``)."""
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    """Measurement windows and smoothing of every link (TOML table ``[monitor]``)."""
    probe_port: int = 0
    """UDP port of the loss probe's echo on the listen host (0: any free one; -1: no probe)."""
    probe_interval_ms: int = 50
    """How often each agent sends a loss probe (about 48 bytes)."""
    checkpoint_dir: Path | None = None
    """Where round checkpoints go; resumed from on start. None: no checkpoints."""
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    """Largest chunk data accepted or sent, in bytes."""
    heartbeat_ms: int = 1000
    """Interval agents send heartbeats at."""
    liveness_timeout_s: float = 30.0
    """An agent silent (no message at all) this long is dropped from the round."""
    final_wait_s: float = 30.0
    """After the last round, how long to wait for agents to close their streams (each does
    once it has applied that round) before the coordinator stops; on a slow link the final
    broadcast takes a while."""
    port_file: Path | None = None
    """Write the bound port here once serving (for port 0)."""
    status_file: Path | None = None
    """Rewrite the status (as JSON) here after every round and at exit."""

    @property
    def outer(self) -> OuterSettings:
        """The outer optimizer's settings, defaults resolved."""
        return OuterSettings.resolve(self.outer_optimizer, self.outer_lr, self.outer_momentum)

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
        self.policy = _section(PolicyConfig, self.policy, "mode")
        self.monitor = _section(MonitorConfig, self.monitor, "window_s")
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
        require("coordinator", self.final_wait_s >= 0, "final_wait_s", self.final_wait_s, ">= 0")
        require("coordinator", ":" in self.listen, "listen", self.listen, "HOST:PORT")
        if self.certs is not None:
            self.ca = self.ca or self.certs / "ca.crt"
            self.cert = self.cert or self.certs / "coordinator.crt"
            self.key = self.key or self.certs / "coordinator.key"
            self.crl = self.crl or self.certs / "crl.pem"
        for name in ("ca", "cert", "key"):
            require(
                "coordinator",
                getattr(self, name) is not None,
                name,
                None,
                "set (or give certs=DIR)",
            )


def _section(cls: type, value: Any, scalar_key: str) -> Any:
    """A nested option: the dataclass itself, a TOML table of its fields, or one scalar."""
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        return cls(**value)
    kind = type(getattr(cls(), scalar_key))
    return cls(**{scalar_key: kind(value)})

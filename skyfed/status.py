"""The coordinator's status as plain dataclasses, free of protobuf: who is connected and how,
recent rounds, the replicas. What the ``Status`` RPC answers (``proto/serde.py`` converts it)
and the status file holds; the coordinator builds it (``coordinator/snapshot.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from skyfed.compression.monitor import Window


@dataclass(frozen=True, slots=True)
class Efficiency:
    """An exchange against its floor: what status shows for a link and a round."""

    round: int
    exchange_s: float
    floor_s: float
    ratio: float
    rtt_ms: float
    rate_mbit: float
    """The rate the floor assumes."""
    goodput_mbit: float
    """The exchange's bytes over its time."""
    streams: int
    limit: str
    """What holds the exchange above its floor ("" when within :data:`HIGH_RATIO`)."""
    cloud: str = ""
    name: str = ""
    """The agent whose link it is (filled in by the coordinator for status)."""


@dataclass(slots=True)
class RoundStats:
    """One round's figures; the open round's are filled in as it goes."""

    round: int
    opened_at: float = 0.0
    duration_s: float = 0.0
    train_s: float = 0.0
    contributors: int = 0
    mean_loss: float = float("nan")
    bytes_up: int = 0
    bytes_down: int = 0
    raw_bytes_up: int = 0
    raw_bytes_down: int = 0
    downlink_codec: str = ""
    staged_memory_bytes: int = 0
    """The round's uplinks staged in memory at its close (``stage_memory``)."""
    staged_disk_bytes: int = 0
    """The round's uplinks staged on disk at its close, past ``stage_memory``."""
    wall_s: float = 0.0
    """Seconds since the coordinator started, when the round closed."""
    links: list[Efficiency] = field(default_factory=list)
    """Each link's exchange against its floor, once its agent timed it (its next
    contribution reports it)."""
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    """The named metrics each site's contribution to this round carried, by agent name,
    taken as the round closes (``rounds.jsonl``; the wire's status has no field for it)."""


@dataclass(frozen=True, slots=True)
class AgentStatus:
    cloud: str
    name: str
    state: str
    """syncing | idle | sending | disconnected | revoked (its certificate was revoked) |
    down (it left saying why: ``last_error``)."""
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
    windows: list[Window] = field(default_factory=list)
    """The link monitor's closed windows, oldest first (only when asked for)."""
    raw_bytes_up: int = 0
    """What the link's contributions weigh as fp32, in bytes."""
    raw_bytes_down: int = 0
    """What the link's broadcasts weigh as fp32, in bytes."""
    streams: int = 1
    """Connections its session stripes over now (docs/striping.md)."""
    stream_switches: int = 0
    efficiency: Efficiency | None = None
    """Its latest timed exchange against the link's floor."""
    codec_params: str = ""
    """Its codec's parameters for the next contribution, a JSON object ("": the codec's
    defaults): the long-phase rule's EC-SGD blocks show here (docs/compression.md)."""
    local_steps: int = 0
    """Local steps per round its hello reported (0: an agent from before the field)."""
    dp: int = 0
    """Its site's data-parallel replicas (0: not said); ``tp`` ranks each."""
    tp: int = 1
    last_error: str = ""
    """Why its site last went down, as it said (docs/sites.md); "" if it never failed."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The named metrics its site last reported (a script's ``skyfed.Site.report``)."""
    metrics_round: int = -1
    """The round whose contribution carried ``metrics`` (-1: none yet)."""


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """A coordinator replica holding a live etcd lease (docs/failover.md)."""

    name: str
    address: str
    state: str = "standby"
    """leader | following | catching-up | behind | standby (one the leader does not hear from)."""
    round: int = -1
    """The last round its state holds (-1: not known)."""
    lag: int = -1
    """Rounds it is behind the leader's last released round (-1: not known)."""


@dataclass(frozen=True, slots=True)
class Failover:
    """One change of leader, as the replica that took over recorded it (docs/failover.md)."""

    term: int
    replica: str
    """The new leader."""
    previous: str = ""
    """The replica that led before ("": none known)."""
    cause: str = ""
    """Why the previous leader went: ``resigned`` (it stopped cleanly) or ``lease expired``
    (killed, its host lost, or cut off from etcd)."""
    duration_s: float = 0.0
    """The previous leader's loss noticed -> the new leader serving."""
    round: int = 0
    """The first round the new leader opens."""
    lost_rounds: int = 0
    """Released rounds the new leader's state did not hold (0 unless every standby was
    behind)."""
    at_unix_s: float = 0.0
    """When it took over, seconds since the epoch."""


@dataclass(frozen=True, slots=True)
class ReplicaSet:
    """The coordinator replicas as the one that answered sees them (docs/failover.md)."""

    replica: str
    """The replica that answered."""
    leading: bool
    """It leads now."""
    term: int = 0
    """The leader's term: its etcd key's create revision, growing with every new leader
    (0: no leader known)."""
    leader: str = ""
    """The leader's replica name ("": none known)."""
    leader_address: str = ""
    """HOST:PORT agents dial for the leader."""
    members: list[ReplicaInfo] = field(default_factory=list)
    """Every replica holding a live etcd lease, by name."""
    failovers: list[Failover] = field(default_factory=list)
    """Every change of leader, oldest first."""
    released: int = -1
    """The last round the leader released to the agents (-1: none yet)."""
    alone: bool = False
    """The leader releases rounds with no standby following it (no other replica holds them)."""


@dataclass(frozen=True, slots=True)
class Status:
    """What ``Status`` answers and the status file holds (``StatusReply`` on the wire)."""

    round: int
    agents: list[AgentStatus]
    weights_digest: str
    uptime_s: float
    rounds: list[RoundStats]
    finished: bool
    exchange: str
    rounds_planned: int = 0
    """Rounds this run trains (0: until stopped)."""
    min_agents: int = 1
    """Agents the first round (and the first after a restart) waits for."""
    refusals: dict[str, int] = field(default_factory=dict)
    """Refused contributions and peers, by gRPC status code name."""
    checkpoints: int = 0
    """Checkpoints written since the coordinator started."""
    checkpoint_s: float = 0.0
    """Seconds spent writing them."""
    eval_round: int = -1
    """Round of the last held-out evaluation (-1: none yet)."""
    eval_loss: float = 0.0
    """Its loss: the task's ``eval_loss`` on the canonical weights (0 while ``eval_round``
    is -1)."""
    eval_metrics: dict[str, float] = field(default_factory=dict)
    """Every named metric of that evaluation (a task's ``eval_metrics``: loss, accuracy,
    perplexity...; ``{"loss": eval_loss}`` for a task with ``eval_loss`` alone)."""
    replicas: ReplicaSet | None = None
    """The coordinator replicas (docs/failover.md); None: one coordinator, no election."""

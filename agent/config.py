"""The agent's configuration: one dataclass, one TOML file, env and flags on top."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from skyfed.agent.placement import Launcher
from skyfed.config.checks import check_types, require
from skyfed.wire import MAX_LOCAL_STEPS

Device = Literal["auto", "cpu", "cuda"]
"""Where a site's ranks train."""
DpMode = Literal["auto", "fsdp", "hsdp", "ddp"]
"""How a site's data-parallel replicas keep one model (``skyfed.agent.parallelize``)."""
DP_MODES: tuple[str, ...] = get_args(DpMode)


@dataclass(kw_only=True, slots=True)
class AgentConfig:
    """Everything ``agent start`` needs. TOML keys are these field names."""

    cloud: str
    """This site's cloud; must match the certificate's SPIFFE identity."""
    name: str = ""
    """This agent's name (default ``<cloud>-1``); must match the certificate."""
    coordinator: str = "localhost:7443"
    """Coordinator address, HOST:PORT; with replicas, each one's, comma-separated
    (``a:7443,b:7443,c:7443``): a session that ends tries the next, and the address a
    standby names first (docs/failover.md). One DNS name with several addresses works too
    when every replica's certificate names it."""
    certs: Path | None = None
    """A ``certs`` directory: ca.crt, <name>.crt, <name>.key. Explicit paths win."""
    ca: Path | None = None
    """CA certificate (PEM) the coordinator's certificate must chain to."""
    cert: Path | None = None
    """This agent's certificate (PEM), whose SPIFFE identity names its cloud and name."""
    key: Path | None = None
    """This agent's private key (PEM, 0600)."""
    server_name: str | None = None
    """TLS name to expect on the coordinator's certificate, if not the host in ``coordinator``."""
    task: str = "chargpt"
    """Task to train (``chargpt`` or ``module:factory``); must be the federation's."""
    seed: int = 0
    """Seed of the initial weights (must match the coordinator's), of the data order and,
    with ``name``, of the uplink's stochastic rounding (EC-SGD)."""
    shard: int = 0
    """Which shard of the task's data this site trains on. With one shard (the default)
    each site draws its own random windows of all the data, seeded by ``seed`` and its name,
    so sites never train on identical batches (``skyfed.agent.launch.data_seed``)."""
    num_shards: int = 1
    """How many shards the data is cut into."""
    local_steps: int = 4
    """Optimizer steps between exchanges; the pseudo-gradient spans them. When the
    coordinator's ``exchange`` is ``gradient``: batches whose mean gradient is the step.
    A far site: 64-128, for which the link gets EC-SGD 2-bit by itself (on the embedded
    task at 128: 1.61x data-parallel's steps to its loss at 1225x fewer bytes;
    docs/outer-optimizer.md)."""
    rounds: int = 0
    """Stop after applying this many rounds (0: until the coordinator says final)."""
    dp: int = 0
    """Data-parallel replicas of the site, each ``tp`` ranks (docs/sites.md); 0: the ranks
    a launcher started over ``tp``, or 1 when this command starts the ranks. Each replica
    trains on its ``1/dp`` slice of every batch, so the task's batch must divide by it."""
    tp: int = 1
    """Tensor-parallel ranks of each replica, one process each (see ``skyfed.agent.ranks``)."""
    dp_mode: DpMode = "auto"
    """How the replicas keep one model: ``fsdp`` (FSDP2: parameters, gradients and
    optimizer state sharded over the replicas), ``hsdp`` (FSDP2 sharded within groups of
    ``dp_shard`` replicas, a node's, and replicated across them), ``ddp`` (whole replicas,
    gradients all-reduced), or ``auto``: DDP while a replica's training state takes at most
    a quarter of one rank's memory, FSDP2 beyond (docs/sites.md)."""
    dp_shard: int = 0
    """``hsdp``: the replicas of one shard group (0: those on one node, from the launcher;
    all of them when this command spawns the ranks). Must divide ``dp``."""
    device: Device = "auto"
    """Where the ranks train: ``cpu`` (Gloo), ``cuda`` (NCCL, rank r on ``cuda:r``; under a
    launcher, the GPU of the local rank) or
    ``auto`` (``cuda`` when there is a GPU for every rank, else ``cpu``)."""
    launcher: Launcher = "auto"
    """Who starts the site's ranks: ``spawn`` (this command starts ``dp x tp`` rank
    processes), ``slurm`` (each ``srun`` task is one rank), ``torchrun`` (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``...), or ``auto``: ``slurm`` inside an ``srun`` step,
    ``torchrun`` when ``RANK`` and ``WORLD_SIZE`` are set, else ``spawn`` (see
    ``docs/deployment.md``)."""
    state_dir: Path | None = None
    """A directory for the site's own state, kept across restarts: its error-feedback
    residuals in logical coordinates (resharded when the site comes back with another
    layout) and the reason it last stopped, which its next hello tells the coordinator
    (docs/sites.md). None: nothing kept."""
    gpu_every_steps: int = 10
    """Read each rank's GPU (NVML: utilisation, memory, temperature, power) every this
    many local steps (0: never)."""
    gpu_warn_c: float = 85.0
    """Log a warning when a GPU's temperature passes this many degrees Celsius."""
    reconnect_initial_s: float = 0.2
    """First reconnect delay; doubles up to ``reconnect_max_s``, with jitter."""
    reconnect_max_s: float = 5.0
    """Longest reconnect delay, in seconds; the doubling stops here."""
    give_up_after_s: float = 600.0
    """Stop retrying after this long without a session (0: never)."""
    report: Path | None = None
    """Write a JSON report (round, weights digest, bytes, loss) here after every round."""
    threads: int = 1
    """torch intra-op threads for local training."""
    metrics_listen: str = ""
    """HOST:PORT of the plain-HTTP ``/metrics``, ``/healthz`` and ``/readyz`` port ("": off;
    ready = in a session). Outside mTLS: loopback only unless ``metrics_public``."""
    metrics_public: bool = False
    """Allow ``metrics_listen`` on a non-loopback address (a pod IP for Kubernetes probes)."""
    max_streams: int = 16
    """Most TCP connections this agent stripes its session over; the coordinator picks
    each link's N within it and its own bound (1: one plain stream; docs/striping.md)."""

    @property
    def ranks(self) -> int:
        """The site's ranks, ``dp x tp`` (``dp`` 0 counts as 1 until a launcher sets it)."""
        return max(1, self.dp) * self.tp

    @property
    def coordinators(self) -> list[str]:
        """Every coordinator replica's HOST:PORT, in the order given."""
        return [a.strip() for a in self.coordinator.split(",") if a.strip()]

    def __post_init__(self) -> None:
        check_types(self, "agent")
        if not self.name:
            self.name = f"{self.cloud}-1"
        checks = [
            (1 <= self.local_steps <= MAX_LOCAL_STEPS, "local_steps", f"in 1..{MAX_LOCAL_STEPS}"),
            (self.rounds >= 0, "rounds", ">= 0"),
            (self.tp >= 1, "tp", ">= 1"),
            (self.dp >= 0, "dp", ">= 0 (0: from the launcher)"),
            (self.dp_shard >= 0, "dp_shard", ">= 0 (0: a node's replicas)"),
            (self.gpu_every_steps >= 0, "gpu_every_steps", ">= 0"),
            (0 < self.gpu_warn_c < 200, "gpu_warn_c", "in (0, 200) degrees C"),
            (self.num_shards >= 1, "num_shards", ">= 1"),
            (0 <= self.shard < self.num_shards, "shard", f"in 0..{self.num_shards - 1}"),
            (self.reconnect_initial_s > 0, "reconnect_initial_s", "> 0"),
            (self.reconnect_max_s >= self.reconnect_initial_s, "reconnect_max_s", ">= initial"),
            (all(":" in a for a in self.coordinators), "coordinator", "HOST:PORT[,HOST:PORT...]"),
            (self.threads >= 1, "threads", ">= 1"),
            (1 <= self.max_streams <= 64, "max_streams", "in 1..64"),
            (self.give_up_after_s >= 0, "give_up_after_s", ">= 0"),
        ]
        for ok, field, what in checks:
            require("agent", ok, field, getattr(self, field), what)
        if self.metrics_listen:
            from skyfed.metrics.http import listen_problem  # its server's packages: when used

            problem = listen_problem(self.metrics_listen, public=self.metrics_public)
            require("agent", not problem, "metrics_listen", self.metrics_listen, problem)
        if self.certs is not None:
            self.ca = self.ca or self.certs / "ca.crt"
            self.cert = self.cert or self.certs / f"{self.name}.crt"
            self.key = self.key or self.certs / f"{self.name}.key"
        for field in ("ca", "cert", "key"):
            value = getattr(self, field)
            require("agent", value is not None, field, value, "set (or give certs=DIR)")

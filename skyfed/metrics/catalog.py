"""Every metric skyfed exports, in one table: the exporters, the docs and Grafana's test read it.

Names follow Prometheus' conventions: the ``skyfed_`` prefix, snake_case, base units in
the name (seconds, bytes, a ratio in 0..1), ``_total`` on counters.
"""

from __future__ import annotations

from dataclasses import dataclass

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
COORDINATOR, AGENT = "coordinator", "agent"
# Round durations from a CPU demo (~0.3 s) to a WAN round of minutes, in seconds.
ROUND_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric family as it appears on ``/metrics``."""

    name: str
    """Exposition name; counters end in ``_total``."""
    kind: str
    """``counter``, ``gauge`` or ``histogram``."""
    help: str
    """The ``# HELP`` line: what it counts, in which unit."""
    role: str
    """Which process exports it: ``coordinator`` or ``agent``."""
    labels: tuple[str, ...] = ()
    """Label names, in order."""


def _c(name: str, kind: str, help: str, *labels: str) -> Metric:
    return Metric(name, kind, help, COORDINATOR, labels)


def _a(name: str, kind: str, help: str, *labels: str) -> Metric:
    return Metric(name, kind, help, AGENT, labels)


METRICS: tuple[Metric, ...] = (
    _c("skyfed_build_info", GAUGE, "Always 1; labels say the version, task and exchange.", "version", "task", "exchange"),
    _c("skyfed_uptime_seconds", GAUGE, "Seconds since the coordinator started."),
    _c("skyfed_round", GAUGE, "The round now open (or next to open)."),
    _c("skyfed_rounds_planned", GAUGE, "Rounds this run trains (0: until stopped)."),
    _c("skyfed_finished", GAUGE, "1 once the last planned round has closed."),
    _c("skyfed_rounds_total", COUNTER, "Rounds closed since the coordinator started."),
    _c("skyfed_round_duration_seconds", HISTOGRAM, "Wall time of a round, open to close."),
    _c("skyfed_round_training_seconds_total", COUNTER, "Slowest contributor's local training time, summed over rounds."),
    _c("skyfed_round_exchange_seconds_total", COUNTER, "Round time beyond the slowest contributor's training (the exchange), summed over rounds."),
    _c("skyfed_round_contributors", GAUGE, "Contributions the last closed round averaged."),
    _c("skyfed_round_staged_bytes", GAUGE, "The last closed round's uplinks as staged for its close: in memory, or on disk past stage_memory.", "where"),
    _c("skyfed_training_loss", GAUGE, "Mean training loss the contributors reported in the last closed round."),
    _c("skyfed_eval_loss", GAUGE, "Held-out loss of the canonical weights (the task's eval_loss), at skyfed_eval_round."),
    _c("skyfed_eval_round", GAUGE, "Round whose weights skyfed_eval_loss evaluated."),
    _c("skyfed_eval_metric", GAUGE, "Each named metric of the last held-out evaluation (the task's eval_metrics: loss, accuracy, perplexity...), at skyfed_eval_round.", "name"),
    _c("skyfed_bytes_total", COUNTER, "Gradient and aggregate bytes of all rounds: wire (compressed) or raw (as fp32).", "direction", "kind"),
    _c("skyfed_agents", GAUGE, "Connected agents by session state.", "state"),
    _c("skyfed_agents_expected", GAUGE, "Agents that must be connected before the first round opens (min_agents)."),
    _c("skyfed_link_bytes_total", COUNTER, "Bytes of one agent's link: wire (chunk data) or raw (as fp32).", "agent", "direction", "kind"),
    _c("skyfed_link_codec", GAUGE, "1 for the codec the link uses now, 0 for the others.", "agent", "codec"),
    _c("skyfed_link_codec_switches_total", COUNTER, "Codec switches the link policy made on the link.", "agent"),
    _c("skyfed_link_streams", GAUGE, "Parallel connections carrying the link's chunks.", "agent"),
    _c("skyfed_link_rtt_seconds", GAUGE, "Smoothed round-trip time of the link.", "agent"),
    _c("skyfed_link_jitter_seconds", GAUGE, "Smoothed round-trip jitter of the link.", "agent"),
    _c("skyfed_link_loss_ratio", GAUGE, "Probe loss of the link, 0..1.", "agent"),
    _c("skyfed_link_goodput_bytes_per_second", GAUGE, "Smoothed goodput of the link's uploads.", "agent"),
    _c("skyfed_link_exchange_floor_ratio", GAUGE, "The link's exchange time over its physical floor (RTT and rate); 1 is the best possible.", "agent"),
    _c("skyfed_link_last_round", GAUGE, "Last round the agent contributed to.", "agent"),
    _c("skyfed_link_metric", GAUGE, "Each named metric the agent's site last reported with a contribution (a script's skyfed.Site.report).", "agent", "name"),
    _c("skyfed_refusals_total", COUNTER, "Contributions and peers refused, by gRPC status code.", "code"),
    _c("skyfed_checkpoints_total", COUNTER, "Checkpoints written."),
    _c("skyfed_checkpoint_seconds_total", COUNTER, "Seconds rounds waited for their checkpoint to be written."),
    _c("skyfed_replica_term", GAUGE, "The leading replica's term (its etcd key's create revision); no sample with one coordinator."),
    _c("skyfed_replica_leader", GAUGE, "1 for the replica that leads, 0 for the others.", "replica"),
    _c("skyfed_replica_lag_rounds", GAUGE, "Rounds a replica's state is behind the last round released to the agents (0: it holds it).", "replica"),
    _c("skyfed_replica_alone", GAUGE, "1 while the leader releases rounds with no standby following it."),
    _c("skyfed_failovers_total", COUNTER, "Changes of leader the federation recorded, by cause (resigned, lease expired).", "cause"),
    _c("skyfed_failover_seconds", GAUGE, "The last failover: the old leader's loss noticed to the new leader serving."),
    _a("skyfed_agent_info", GAUGE, "Always 1; labels name the agent.", "agent", "cloud", "version"),
    _a("skyfed_agent_connected", GAUGE, "1 while the agent is in a session with the coordinator."),
    _a("skyfed_agent_round", GAUGE, "Last round the agent applied."),
    _a("skyfed_agent_rounds_total", COUNTER, "Rounds applied by this agent process."),
    _a("skyfed_agent_training_loss", GAUGE, "Training loss of the agent's last local round."),
    _a("skyfed_agent_metric", GAUGE, "Each named metric this site last reported (a script's skyfed.Site.report).", "name"),
    _a("skyfed_agent_bytes_total", COUNTER, "Chunk bytes this agent sent (up) and received (down).", "direction"),
    _a("skyfed_agent_codec", GAUGE, "1 for the codec the agent's uploads use now.", "codec"),
    _a("skyfed_agent_site_ranks", GAUGE, "The site's ranks, dp x tp; labels say its layout.", "dp", "tp"),
    _a("skyfed_agent_gpu_utilization_ratio", GAUGE, "Share of the last sample period a kernel ran on the GPU, 0..1 (NVML).", "rank", "host", "gpu"),
    _a("skyfed_agent_gpu_memory_used_bytes", GAUGE, "GPU memory in use (NVML).", "rank", "host", "gpu"),
    _a("skyfed_agent_gpu_memory_total_bytes", GAUGE, "GPU memory in all (NVML).", "rank", "host", "gpu"),
    _a("skyfed_agent_gpu_temperature_celsius", GAUGE, "GPU core temperature (NVML); the agent warns past gpu_warn_c.", "rank", "host", "gpu"),
    _a("skyfed_agent_gpu_power_watts", GAUGE, "GPU power draw (NVML).", "rank", "host", "gpu"),
)  # fmt: skip


def of_role(role: str) -> tuple[Metric, ...]:
    return tuple(m for m in METRICS if m.role == role)

"""The agent's exporter: reads the agent's snapshot at scrape time.

The snapshot is plain data: ``name``, ``cloud``, ``connected`` (in a session now),
``round`` (last applied), ``rounds_applied``, ``loss``, ``bytes_up``, ``bytes_down``,
``codec``, ``dp`` and ``tp`` (the site's layout), ``metrics`` (the named metrics the
site last reported), ``gpus`` (the latest NVML reading of each
rank's GPU, ``skyfed.agent.gpus.GpuReading`` as a dict; none: no GPU series) (see
``skyfed.agent.observe``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from skyfed.compression import codec_names
from skyfed.metrics.catalog import AGENT
from skyfed.metrics.coordinator import VERSION
from skyfed.metrics.families import Families


class AgentCollector(Collector):
    """A prometheus-client collector over ``snapshot()``."""

    def __init__(self, snapshot: Callable[[], Mapping[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        out = Families(AGENT)
        out.add("skyfed_agent_info", 1, snap["name"], snap.get("cloud", ""), VERSION)
        out.add("skyfed_agent_connected", float(bool(snap.get("connected"))))
        out.add("skyfed_agent_round", int(snap.get("round", -1)))
        out.add("skyfed_agent_rounds_total", int(snap.get("rounds_applied", 0)))
        loss = float(snap.get("loss", math.nan))
        if math.isfinite(loss):
            out.add("skyfed_agent_training_loss", loss)
        for metric, value in sorted(snap.get("metrics", {}).items()):
            out.add("skyfed_agent_metric", float(value), metric)
        out.add("skyfed_agent_bytes_total", float(snap.get("bytes_up", 0)), "up")
        out.add("skyfed_agent_bytes_total", float(snap.get("bytes_down", 0)), "down")
        codec = str(snap.get("codec", "")).split(":", 1)[0]
        for each in codec_names():
            out.add("skyfed_agent_codec", float(each == codec), each)
        dp, tp = int(snap.get("dp", 1)), int(snap.get("tp", 1))
        out.add("skyfed_agent_site_ranks", dp * tp, str(dp), str(tp))
        for gpu in snap.get("gpus", ()):
            _gpu(out, gpu)
        return iter(out)


GPU_SERIES = {
    "skyfed_agent_gpu_utilization_ratio": "utilization",
    "skyfed_agent_gpu_memory_used_bytes": "memory_used_bytes",
    "skyfed_agent_gpu_memory_total_bytes": "memory_total_bytes",
    "skyfed_agent_gpu_temperature_celsius": "temperature_c",
    "skyfed_agent_gpu_power_watts": "power_w",
}


def _gpu(out: Families, gpu: Mapping[str, Any]) -> None:
    labels = (str(gpu["rank"]), str(gpu["host"]), str(gpu["index"]))
    for name, key in GPU_SERIES.items():
        out.add(name, float(gpu[key]), *labels)

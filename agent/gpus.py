"""GPU telemetry: each rank reads its own GPU through NVML every N local steps; rank 0
gathers the readings once per round, warns on a hot GPU and exports them (docs/sites.md).

No GPU, or no NVML (the library, the driver, the ``nvidia-ml-py`` package): no readings,
no GPU series, and one info line, never an error: telemetry must not stop training.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import asdict, dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

REARM_C = 5.0
"""A warned GPU warns again once it has cooled this far below the threshold."""


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU as its rank last read it."""

    rank: int
    """The site rank training on it."""
    host: str
    index: int
    """Its NVML index on ``host`` (what ``nvidia-smi`` lists it as)."""
    name: str
    utilization: float
    """Share of the last sample period a kernel ran, 0..1."""
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_c: float
    power_w: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class GpuWatch:
    """One rank's GPU, read every ``every_steps`` local steps (:meth:`step`)."""

    def __init__(
        self, device: torch.device, rank: int, every_steps: int = 10, nvml: Any = None
    ) -> None:
        self.rank = rank
        self.every_steps = every_steps
        self.last: GpuReading | None = None
        self._nvml: Any = None
        self._handle: Any = None
        self.why_not = self._open(device, nvml) if every_steps > 0 else "gpu_every_steps is 0"
        """Why there is no telemetry ("" when there is)."""

    def _open(self, device: torch.device, nvml: Any) -> str:
        if device.type != "cuda":
            return "the site trains on CPU"
        try:
            if nvml is None:
                import pynvml

                nvml = pynvml
            nvml.nvmlInit()
            self._handle = _handle_of(nvml, device)
        except Exception as exc:  # no package, no library, no driver: no telemetry
            return f"NVML is not available ({type(exc).__name__}: {exc})"
        self._nvml = nvml
        return ""

    @property
    def active(self) -> bool:
        return self._handle is not None

    def step(self, step: int) -> None:
        """After local step ``step`` (counted from 1): read the GPU on the first and on
        every ``every_steps``-th."""
        if self.active and (step == 1 or step % self.every_steps == 0):
            self.last = self.read()

    def read(self) -> GpuReading | None:
        """The GPU now; None (and telemetry off from here) if NVML fails."""
        nvml, handle = self._nvml, self._handle
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            reading = GpuReading(
                rank=self.rank,
                host=socket.gethostname().split(".")[0],
                index=int(nvml.nvmlDeviceGetIndex(handle)),
                name=_text(nvml.nvmlDeviceGetName(handle)),
                utilization=nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                memory_used_bytes=int(memory.used),
                memory_total_bytes=int(memory.total),
                temperature_c=float(
                    nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
                ),
                power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # NVML says mW
            )
        except Exception as exc:
            self._handle, self.why_not = None, f"NVML failed ({type(exc).__name__}: {exc})"
            log.warning("[Agent.GPU] rank %d: %s; GPU telemetry off", self.rank, self.why_not)
            return None
        return reading


def _handle_of(nvml: Any, device: torch.device) -> Any:
    """The NVML handle of the CUDA device this rank trains on: by its UUID, so a
    ``CUDA_VISIBLE_DEVICES`` that renumbers devices (``srun --gpus-per-task``) cannot
    confuse it; by its PCI bus id where torch has no UUID; by its index where torch cannot
    describe the device at all."""
    try:
        props = torch.cuda.get_device_properties(device)
    except (RuntimeError, AssertionError, AttributeError):
        return nvml.nvmlDeviceGetHandleByIndex(device.index or 0)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        return nvml.nvmlDeviceGetHandleByUUID(text if text.startswith("GPU-") else f"GPU-{text}")
    pci: Any = props  # the PCI fields are missing from torch's stubs
    bus = f"{pci.pci_domain_id:08x}:{pci.pci_bus_id:02x}:{pci.pci_device_id:02x}.0"
    return nvml.nvmlDeviceGetHandleByPciBusId_v2(bus)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GpuBoard:
    """Rank 0's view of the site's GPUs: the latest reading of each, a warning when one
    passes ``warn_c`` (once per crossing), and one info line if there are none."""

    def __init__(self, warn_c: float = 85.0) -> None:
        self.warn_c = warn_c
        self.readings: dict[int, GpuReading] = {}
        self._hot: set[int] = set()
        self._said_none = False

    def update(self, readings: list[GpuReading | None], why_not: str) -> None:
        """This round's readings, one per rank (None: that rank has none)."""
        got = [r for r in readings if r is not None]
        if not got and not self.readings and not self._said_none:
            self._said_none = True
            log.info("[Agent.GPU] no GPU telemetry: %s", why_not or "no readings")
        for reading in got:
            self.readings[reading.rank] = reading
            self._check(reading)

    def _check(self, r: GpuReading) -> None:
        if r.temperature_c > self.warn_c and r.rank not in self._hot:
            self._hot.add(r.rank)
            log.warning(
                "[Agent.GPU] rank %d: GPU %d (%s) on %s at %.0f C, over %.0f C",
                r.rank,
                r.index,
                r.name,
                r.host,
                r.temperature_c,
                self.warn_c,
            )
        elif r.temperature_c <= self.warn_c - REARM_C:
            self._hot.discard(r.rank)

    def summary(self) -> dict[str, float]:
        """The site's GPUs in four named metrics, which ride on its contributions to the
        coordinator's status, metrics, ``rounds.jsonl`` and run report like a script's own
        (docs/sites.md): mean utilisation and the fullest memory in percent, the hottest
        GPU in C, the site's power in W. Empty without readings (a CPU site)."""
        got = list(self.readings.values())
        if not got:
            return {}
        return {
            "gpu_util_pct": 100.0 * sum(r.utilization for r in got) / len(got),
            "gpu_memory_pct": max(
                (
                    100.0 * r.memory_used_bytes / r.memory_total_bytes
                    for r in got
                    if r.memory_total_bytes
                ),
                default=0.0,
            ),
            "gpu_temperature_c": max(r.temperature_c for r in got),
            "gpu_power_w": sum(r.power_w for r in got),
        }

    def as_list(self) -> list[dict[str, Any]]:
        """The latest readings as plain data, by rank (the exporter's and the report's)."""
        return [self.readings[rank].as_dict() for rank in sorted(self.readings)]

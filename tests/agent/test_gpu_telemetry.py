"""GPU telemetry: NVML read every N steps, a warning once per crossing of the threshold, the
exporter's GPU series; and with no GPU or no NVML, no series and one info line, no error."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from skyfed.agent.gpus import GpuBoard, GpuReading, GpuWatch
from skyfed.metrics.agent import AgentCollector
from skyfed.procs import command


def reading(rank: int, temperature_c: float) -> GpuReading:
    return GpuReading(
        rank, "node-a", rank, "NVIDIA H100", 0.9, 40 << 30, 80 << 30, temperature_c, 650.0
    )


def exposition(snap: dict) -> str:
    registry = CollectorRegistry()
    registry.register(AgentCollector(lambda: {"name": "aws-1", **snap}))
    return generate_latest(registry).decode()


def gpu_samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("skyfed_agent_gpu_")]


def test_without_nvml_a_gpu_rank_has_no_readings_and_says_why():
    """This machine has the nvml package but no NVIDIA driver: the real NVML fails to load."""
    watch = GpuWatch(torch.device("cuda", 0), rank=0)
    assert not watch.active and "NVML is not available" in watch.why_not
    watch.step(1)
    assert watch.last is None


def test_no_gpu_telemetry_is_one_info_line_and_no_gpu_series(caplog):
    board = GpuBoard()
    watch = GpuWatch(torch.device("cpu"), rank=0)
    with caplog.at_level(logging.INFO, logger="skyfed.agent.gpus"):
        for _ in range(3):
            board.update([watch.last, None], watch.why_not)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["[Agent.GPU] no GPU telemetry: the site trains on CPU"]
    assert gpu_samples(exposition({"gpus": board.as_list(), "dp": 2, "tp": 1})) == []


def test_a_hot_gpu_warns_once_until_it_cools(caplog):
    board = GpuBoard(warn_c=85.0)
    with caplog.at_level(logging.WARNING, logger="skyfed.agent.gpus"):
        for temperature in (70.0, 86.0, 88.0, 82.0, 79.0, 87.0):
            board.update([reading(0, 60.0), reading(1, temperature)], "")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings  # 86 (first crossing) and 87 (after cooling to 79)
    assert warnings[0] == "[Agent.GPU] rank 1: GPU 1 (NVIDIA H100) on node-a at 86 C, over 85 C"


def test_the_exporter_serves_every_gpu_of_the_site_by_rank_host_and_index():
    board = GpuBoard()
    board.update([reading(0, 61.0), reading(1, 64.5)], "")
    text = exposition({"gpus": board.as_list(), "dp": 1, "tp": 2})
    assert 'skyfed_agent_gpu_temperature_celsius{gpu="1",host="node-a",rank="1"} 64.5' in text
    assert 'skyfed_agent_gpu_power_watts{gpu="0",host="node-a",rank="0"} 650.0' in text
    assert 'skyfed_agent_site_ranks{dp="1",tp="2"} 2.0' in text
    assert len(gpu_samples(text)) == 2 * 5


class FakeNvml:
    """NVML's calls as the nvidia-ml-py package names them (a unit test of the mapping; the
    real library is read by scripts/gpu_check.py on a GPU machine)."""

    NVML_TEMPERATURE_GPU = 0

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:  # noqa: N802
        return handle

    def nvmlDeviceGetName(self, handle: int) -> bytes:  # noqa: N802
        return b"NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(used=3 << 30, total=141 << 30, free=138 << 30)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:  # noqa: N802
        return 71

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:  # noqa: N802
        return 412_345  # mW


def test_a_reading_is_taken_on_the_first_step_and_every_nth_in_base_units():
    watch = GpuWatch(torch.device("cuda", 0), rank=3, every_steps=10, nvml=FakeNvml())
    assert watch.active, watch.why_not
    taken = []
    for step in range(1, 31):
        watch.last = None
        watch.step(step)
        if watch.last is not None:
            taken.append(step)
    assert taken == [1, 10, 20, 30]
    got = watch.read()
    assert got is not None
    assert (got.rank, got.index, got.name, got.utilization) == (3, 0, "NVIDIA H200", 0.87)
    assert (got.memory_used_bytes, got.temperature_c, got.power_w) == (3 << 30, 71.0, 412.345)


@pytest.mark.multiprocess
def test_an_agent_on_cpu_reports_no_gpus_and_says_so_once(serve, reaped, pki, tmp_path):
    running = serve(rounds=2, task="skyfed.tasks.examples:mlp_task")
    argv = command(
        "agent", "start", "--cloud", "aws", "--coordinator", f"localhost:{running.port}",
        "--certs", str(pki.directory), "--task", "skyfed.tasks.examples:mlp_task",
        "--dp", "2", "--device", "cpu", "--report", str(tmp_path / "aws.json"),
    )  # fmt: skip
    assert reaped.start("aws", argv).wait(timeout=120) == 0, reaped.log("aws")[-3000:]
    log = reaped.log("aws")
    assert log.count("[Agent.GPU]") == 1 and "no GPU telemetry" in log
    assert " ERROR " not in log and "Traceback" not in log, log[-3000:]
    assert json.loads((tmp_path / "aws.json").read_text())["gpus"] == []


def test_a_reading_crosses_ranks_as_the_control_group_sends_it():
    """Readings reach rank 0 pickled, with each round's losses (``Site.train``)."""
    import pickle

    got = reading(3, 71.0)
    assert pickle.loads(pickle.dumps(got)) == got

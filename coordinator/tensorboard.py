"""TensorBoard scalars of a run (``--tensorboard DIR``): the series the report plots.

Needs the ``tensorboard`` extra (``pip install 'skyfed[tensorboard]'``); the step of every
scalar is the round.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from skyfed.coordinator.evaluate import EvalResult


class TensorBoardSink:
    """Writes every closed round and evaluation as scalars under ``directory``."""

    def __init__(self, directory: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise RuntimeError(
                "tensorboard is not installed: pip install 'skyfed[tensorboard]'"
            ) from exc
        self._writer = SummaryWriter(log_dir=str(directory))

    def round(self, record: dict[str, Any], agents: list[dict[str, Any]]) -> None:
        step = int(record["round"])
        scalars = {
            "loss/train": record["mean_loss"],
            "time/round_s": record["duration_s"],
            "time/training_s": record["train_s"],
            "time/exchange_s": record["exchange_s"],
            "bytes/up_wire": record["bytes_up"],
            "bytes/down_wire": record["bytes_down"],
            "bytes/up_raw": record["raw_bytes_up"],
            "bytes/down_raw": record["raw_bytes_down"],
        }
        for agent in agents:
            name = agent["name"]
            scalars[f"link/{name}/rtt_ms"] = agent["rtt_ms"]
            scalars[f"link/{name}/loss_pct"] = agent["loss_pct"]
            scalars[f"link/{name}/goodput_mbit"] = agent["goodput_mbit"]
        for tag, value in scalars.items():
            if math.isfinite(float(value)):
                self._writer.add_scalar(tag, float(value), step, walltime=None)
        self._writer.add_text("codec", ", ".join(f"{a['name']}={a['codec']}" for a in agents), step)

    def timed(self, round_: int, efficiencies: list[dict[str, Any]]) -> None:
        """The links' exchanges against their floors are in the run history and the
        metrics (docs/operations.md); TensorBoard keeps to the series above."""

    def eval(self, result: EvalResult, wall_s: float) -> None:
        if math.isfinite(result.loss):
            self._writer.add_scalar("loss/eval", result.loss, result.round)

    def failover(self, record: dict[str, Any]) -> None:
        """A new leader took over: its duration, at the first round it opens."""
        self._writer.add_scalar("failover/duration_s", float(record["duration_s"]), record["round"])
        self._writer.add_text(
            "failover",
            f"{record['previous']} -> {record['replica']}: {record['cause']}",
            record["round"],
        )

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()

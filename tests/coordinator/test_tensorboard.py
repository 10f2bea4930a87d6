"""``--tensorboard DIR`` writes the report's series as scalars TensorBoard reads back."""

from __future__ import annotations

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from skyfed.coordinator.evaluate import EvalResult
from skyfed.coordinator.tensorboard import TensorBoardSink


def test_rounds_and_evaluations_become_scalars_by_round(tmp_path):
    sink = TensorBoardSink(tmp_path)
    agent = {"name": "aws-1", "codec": "topk", "rtt_ms": 80.0, "loss_pct": 0.5, "goodput_mbit": 9}
    for r in range(3):
        record = {"round": r, "mean_loss": 3.0 - r, "duration_s": 1.0, "train_s": 0.6}
        record.update(exchange_s=0.4, bytes_up=10, bytes_down=20, raw_bytes_up=40)
        record["raw_bytes_down"] = 80
        sink.round(record, [agent])
    sink.eval(EvalResult(2, 1.25, 0.1), wall_s=5.0)
    sink.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    train = [(e.step, e.value) for e in events.Scalars("loss/train")]
    assert train == [(0, 3.0), (1, 2.0), (2, 1.0)]
    assert [(e.step, e.value) for e in events.Scalars("loss/eval")] == [(2, 1.25)]
    assert {"time/exchange_s", "bytes/up_wire", "link/aws-1/rtt_ms"} <= set(
        events.Tags()["scalars"]
    )

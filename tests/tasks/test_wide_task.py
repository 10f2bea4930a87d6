"""The sized example task: options in the task string, its size, and a real federation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from skyfed.procs import children, command, wait_for_file
from skyfed.tasks import load_task
from skyfed.tasks.examples import parse_size

WIDE = "skyfed.tasks.examples:wide"


def test_size_suffixes_parse_to_counts():
    assert [parse_size(s) for s in ("100M", "25k", "1.5G", "4096")] == [
        100_000_000,
        25_000,
        1_500_000_000,
        4096,
    ]
    with pytest.raises(ValueError, match="not a number"):
        parse_size("big")


def test_task_string_options_size_the_model_within_one_percent():
    for size in (100_000, 1_000_000):
        task = load_task(f"{WIDE}?params={size}&batch=4")
        params = sum(p.numel() for p in task.build_model(0).parameters())
        assert abs(params - size) / size < 0.01, (size, params)
        assert task.batch_size() == 4


def test_a_malformed_task_option_is_a_clear_error():
    with pytest.raises(ValueError, match="not key=value"):
        load_task(f"{WIDE}?params")


def test_same_seed_same_data_and_local_training_lowers_the_loss():
    task = load_task(f"{WIDE}?params=20k")
    a, b = next(task.batches(0, 3, 0)), next(task.batches(0, 3, 0))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], next(task.batches(1, 3, 0))[0])
    model = task.build_model(0)
    opt = task.make_optimizer(model.parameters())
    before = task.eval_loss(model)
    for batch, _ in zip(task.batches(0, 1, 0), range(50), strict=False):
        opt.zero_grad()
        task.loss(model, batch).backward()
        opt.step()
    assert task.eval_loss(model) < before


@pytest.mark.multiprocess
def test_a_small_wide_task_trains_across_three_agent_processes_bit_identical(tmp_path: Path, pki):
    spec = f"{WIDE}?params=50k"
    with children(tmp_path / "logs") as kids:
        flags = {
            "--certs": pki.directory,
            "--listen": "127.0.0.1:0",
            "--port-file": tmp_path / "port",
            "--status-file": tmp_path / "status.json",
            "--rounds": 4,
            "--min-agents": 3,
            "--task": spec,
            "--codec": "fp16",
        }
        coord = kids.start("coordinator", command("coordinator", "serve", *_argv(flags)))
        port = int(wait_for_file(tmp_path / "port", 60, coord))
        for i, cloud in enumerate(("aws", "gcp", "azure")):
            agent = {
                "--cloud": cloud,
                "--coordinator": f"localhost:{port}",
                "--certs": pki.directory,
                "--task": spec,
                "--shard": i,
                "--num-shards": 3,
                "--report": tmp_path / f"{cloud}.json",
            }
            kids.start(cloud, command("agent", "start", *_argv(agent)))
        for name in ("coordinator", "aws", "gcp", "azure"):
            assert kids.procs[name].wait(timeout=180) == 0, kids.log(name)[-3000:]
    status = json.loads((tmp_path / "status.json").read_text())
    assert len(status["rounds"]) == 4
    for cloud in ("aws", "gcp", "azure"):
        rep = json.loads((tmp_path / f"{cloud}.json").read_text())
        assert rep["weights_digest"] == status["weightsDigest"], cloud


def _argv(flags: dict[str, object]) -> list[str]:
    return [str(x) for kv in flags.items() for x in kv]

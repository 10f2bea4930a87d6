"""The trained model leaves as a plain state_dict; a wrong or missing checkpoint is a clear error."""

from __future__ import annotations

import json
import signal
import subprocess

import torch

from skyfed.coordinator import checkpoint
from skyfed.coordinator.export import export_checkpoint
from skyfed.fingerprint import model_spec, spec_digest, weights_digest
from skyfed.procs import command, wait_for_file
from skyfed.tasks import load_task

TASK = "skyfed.tasks.examples:mlp_task"


def save_checkpoint(directory, round_: int = 4) -> list[torch.Tensor]:
    model = load_task(TASK).build_model(7)  # not the export's seed: the weights must win
    named = list(model.named_parameters())
    weights = [p.detach().clone().float() for _, p in named]
    ckpt = checkpoint.Checkpoint(round_, spec_digest(model_spec(named)), weights, None)
    checkpoint.save(directory, ckpt)
    return weights


def test_exported_state_dict_loads_strictly_with_the_checkpoints_weights(tmp_path):
    weights = save_checkpoint(tmp_path / "ckpt")
    meta = export_checkpoint(tmp_path / "ckpt", tmp_path / "model.pt", task=TASK)
    model = load_task(TASK).build_model(0)
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    assert weights_digest([p.detach() for p in model.parameters()]) == weights_digest(weights)
    on_disk = json.loads((tmp_path / "model.json").read_text())
    assert on_disk == meta and meta["round"] == 4 and meta["task"] == TASK


def test_export_of_another_models_checkpoint_is_a_usage_error(tmp_path):
    save_checkpoint(tmp_path / "ckpt")
    argv = command("coordinator", "export", "--checkpoint-dir", str(tmp_path / "ckpt"))
    result = subprocess.run(
        [*argv, "--out", str(tmp_path / "m.pt")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "pass the run's --task" in result.stderr
    assert not (tmp_path / "m.pt").exists()


def test_export_without_a_checkpoint_is_a_usage_error(tmp_path):
    (tmp_path / "empty").mkdir()
    argv = command("coordinator", "export", "--checkpoint-dir", str(tmp_path / "empty"))
    result = subprocess.run(
        [*argv, "--out", str(tmp_path / "m.pt"), "--task", TASK],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "no checkpoint in" in result.stderr


def test_a_coordinator_stopped_before_round_0_exports_nothing_and_says_so(pki, tmp_path, reaped):
    out, port_file = tmp_path / "out" / "model.pt", tmp_path / "port"
    argv = command(
        "coordinator", "serve", "--listen", "127.0.0.1:0", "--certs", str(pki.directory),
        "--min-agents", "2", "--port-file", str(port_file), "--export", str(out),
        "--no-progress",
    )  # fmt: skip
    proc = reaped.start("coordinator", argv)
    wait_for_file(port_file, 60, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 1, reaped.log("coordinator")[-2000:]
    last = reaped.log("coordinator").strip().splitlines()[-1]
    assert "no trained model, nothing written to" in last, last
    assert "Traceback" not in reaped.log("coordinator")
    assert not out.exists() and not out.with_suffix(".json").exists()

"""A user's mistake gets one line naming the option, and exit code 2; a damaged or
unusable checkpoint directory one line and a non-zero exit (docs/operations.md)."""

from __future__ import annotations

import subprocess

import pytest
import torch

from skyfed.coordinator import checkpoint
from skyfed.procs import command


def serve(pki, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    argv = command("coordinator", "serve", "--listen", "127.0.0.1:0", "--rounds", "1", *args)
    if "--certs" not in args:
        argv += ["--certs", str(pki.directory)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


MISTAKES = {
    "certs-dir": (["--certs", "/nonexistent/certs"], "--ca /nonexistent/certs/ca.crt"),
    "status-dir": (["--status-file", "/nonexistent/dir/status.json"], "--status-file"),
    "log-level": (["--log-level", "verbose"], "--log-level"),
    "listen": (["--listen", "127.0.0.1:abc"], "listen="),
    "task": (["--task", "no_such_module:factory"], "--task"),
    "policy-key": (["--config", "{policy_key}"], "[policy]"),
    "monitor-type": (["--config", "{monitor_type}"], "[monitor]"),
    "stage-dir": (["--stage-dir", "/nonexistent/stage"], "--stage-dir /nonexistent/stage"),
    "stage-memory": (["--stage-memory", "-1"], "stage_memory="),
}


@pytest.mark.parametrize("case", list(MISTAKES))
def test_user_mistake_is_one_line_and_exit_code_2(pki, tmp_path, case):
    args, words = MISTAKES[case]
    (tmp_path / "policy.toml").write_text("[policy]\nbogus = 1\n")
    (tmp_path / "monitor.toml").write_text('[monitor]\nwindow_s = "soon"\n')
    paths = {
        "policy_key": str(tmp_path / "policy.toml"),
        "monitor_type": str(tmp_path / "monitor.toml"),
    }
    done = serve(pki, *(a.format(**paths) for a in args))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert words in done.stderr


def _damage_tensor_bytes(path, weights: list[torch.Tensor]) -> None:
    data = bytearray(path.read_bytes())
    needle = weights[0].contiguous().view(torch.uint8).numpy().tobytes()[:64]
    at = data.index(needle)
    for i in range(at + 8, at + 24):  # 16 bytes inside the tensor data
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_damaged_tensor_data_in_a_checkpoint_is_refused_on_load(pki, tmp_path):
    ckpt = tmp_path / "ckpt"
    weights = [torch.randn(64, 64), torch.randn(64)]
    checkpoint.save(ckpt, checkpoint.Checkpoint(3, "abc", weights, None))
    assert checkpoint.load(ckpt).round == 3
    _damage_tensor_bytes(checkpoint.path_for(ckpt, 3), weights)
    with pytest.raises(RuntimeError, match="damaged"):
        checkpoint.load(ckpt)


def test_coordinator_with_a_damaged_checkpoint_exits_with_one_line(pki, tmp_path, serve_):
    ckpt = tmp_path / "ckpt"
    fed = serve_(checkpoint_dir=ckpt).federation
    weights = [w.clone() for w in fed.model.weights]
    checkpoint.save(ckpt, checkpoint.Checkpoint(0, fed.model.spec_digest, weights, None))
    _damage_tensor_bytes(checkpoint.path_for(ckpt, 0), weights)
    done = serve(pki, "--checkpoint-dir", str(ckpt))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "is damaged" in done.stderr


def test_stale_temporary_checkpoint_files_are_removed_at_start(serve_, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    stale = ckpt / f".{checkpoint.path_for(ckpt, 1).name}.tmp"
    stale.write_bytes(b"half a checkpoint")
    serve_(checkpoint_dir=ckpt)
    assert not stale.exists()


def test_a_checkpoint_dir_without_room_for_two_checkpoints_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="room for two checkpoints"):
        checkpoint.check_room(tmp_path, 1 << 60)  # the real file system's free space
    checkpoint.check_room(tmp_path, 1 << 10)


@pytest.fixture
def serve_(request):
    """The suite's in-process ``serve`` fixture (this module's ``serve`` runs the CLI)."""
    return request.getfixturevalue("serve")

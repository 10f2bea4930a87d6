"""Checkpoints are whole or absent, and a damaged one is a clear error."""

from __future__ import annotations

import os

import pytest
import torch

from skyfed.coordinator import checkpoint


def sample(round: int) -> checkpoint.Checkpoint:
    return checkpoint.Checkpoint(round, "abc", [torch.full((3,), float(round))], None)


def test_checkpoint_round_trips(tmp_path):
    checkpoint.save(tmp_path, sample(4))
    loaded = checkpoint.load(tmp_path)
    assert (
        loaded is not None
        and loaded.round == 4
        and torch.equal(loaded.weights[0], torch.full((3,), 4.0))
    )


def test_no_checkpoint_means_a_fresh_start(tmp_path):
    assert checkpoint.load(tmp_path) is None


def test_failed_write_keeps_the_previous_checkpoint_and_leaves_no_temp_file(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, sample(1))

    def crash(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path, sample(2))
    assert checkpoint.load(tmp_path).round == 1
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.LATEST]


def test_damaged_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / checkpoint.LATEST).write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="cannot be read"):
        checkpoint.load(tmp_path)


def test_coordinator_refuses_a_checkpoint_of_another_model(serve, tmp_path):
    checkpoint.save(tmp_path / "ckpt", checkpoint.Checkpoint(0, "other-model", [], None))
    with pytest.raises(RuntimeError, match="is for model other-model"):
        serve(checkpoint_dir=tmp_path / "ckpt")

"""Checkpoints: whole once written, verified on load, written beside the broadcast."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from skyfed.coordinator import checkpoint
from skyfed.coordinator.checkpoint import Checkpoint
from skyfed.fingerprint import integrity_digest, sha256_weights_digest, weights_digest


def _ckpt(round_: int, residual: bool = True) -> Checkpoint:
    gen = torch.Generator().manual_seed(round_)
    weights = [torch.randn(33, 7, generator=gen), torch.randn(5, generator=gen), torch.zeros(0)]
    res = [torch.randn(w.shape, generator=gen) for w in weights] if residual else None
    return Checkpoint(round=round_, spec_digest="abc", weights=weights, downlink_residual=res)


def _same(a: Checkpoint, b: Checkpoint) -> bool:
    pairs = list(zip(a.weights, b.weights, strict=True))
    if a.downlink_residual is not None:
        pairs += list(zip(a.downlink_residual, b.downlink_residual, strict=True))
    return (a.round, a.spec_digest) == (b.round, b.spec_digest) and all(
        torch.equal(x, y) for x, y in pairs
    )


@pytest.mark.parametrize("residual", [True, False])
def test_a_written_checkpoint_loads_bit_for_bit(tmp_path: Path, residual: bool):
    ckpt = _ckpt(4, residual)
    checkpoint.save(tmp_path, ckpt)
    loaded = checkpoint.load(tmp_path)
    assert loaded is not None and _same(loaded, ckpt)
    assert (loaded.downlink_residual is None) == (not residual)


def test_no_checkpoint_is_none(tmp_path: Path):
    assert checkpoint.load(tmp_path) is None


def test_a_torn_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path):
    checkpoint.save(tmp_path, _ckpt(1))
    newest = checkpoint.save(tmp_path, _ckpt(2))
    data = bytearray(newest.read_bytes())
    data[len(data) - 300] ^= 0xFF  # a torn page: bytes no longer match their digest
    newest.write_bytes(bytes(data))
    loaded = checkpoint.load(tmp_path)
    assert loaded is not None and _same(loaded, _ckpt(1))


def test_when_no_checkpoint_verifies_loading_is_a_clear_error(tmp_path: Path):
    path = checkpoint.save(tmp_path, _ckpt(1))
    os.truncate(path, path.stat().st_size - 100)
    with pytest.raises(RuntimeError, match="no checkpoint .* verifies"):
        checkpoint.load(tmp_path)


def test_the_writer_returns_at_once_and_keeps_the_newest_two(tmp_path: Path):
    writer = checkpoint.CheckpointWriter(tmp_path, keep=2)
    for r in range(4):
        ckpt = _ckpt(r)
        writer.submit(ckpt, weights_digest(ckpt.weights))
        writer.wait_written()
        assert checkpoint.path_for(tmp_path, r).exists()  # whole and named once written
    writer.close()
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == [
        checkpoint.path_for(tmp_path, r).name for r in (2, 3)
    ]
    assert writer.times.round == 3 and writer.times.durable_ms >= writer.times.written_ms
    assert _same(checkpoint.load(tmp_path), _ckpt(3))


def test_a_failed_write_is_raised_to_the_round(tmp_path: Path):
    (tmp_path / "blocked").write_text("a file where the directory should be")
    writer = checkpoint.CheckpointWriter(tmp_path / "blocked")
    writer.submit(_ckpt(0), "x")
    with pytest.raises(RuntimeError, match="checkpoint write failed"):
        writer.wait_written()


def test_coordinator_refuses_a_checkpoint_of_another_model(serve, tmp_path):
    checkpoint.save(tmp_path / "ckpt", Checkpoint(0, "other-model", [], None))
    with pytest.raises(RuntimeError, match="is for model other-model"):
        serve(checkpoint_dir=tmp_path / "ckpt")


def test_a_dropped_checkpoint_file_is_overwritten_by_the_next_one(tmp_path: Path):
    writer = checkpoint.CheckpointWriter(tmp_path, keep=2)
    inodes = []
    for r in range(6):
        ckpt = _ckpt(r, residual=r % 2 == 0)  # sizes differ: a recycled file is cut to size
        writer.submit(ckpt, weights_digest(ckpt.weights))
        writer.wait_written()
        inodes.append(checkpoint.path_for(tmp_path, r).stat().st_ino)
        writer.close()  # durable: the file beyond the newest two becomes the spare
    assert len(set(inodes)) < len(inodes), "no file was reused"
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == [
        checkpoint.path_for(tmp_path, r).name for r in (4, 5)
    ]
    for r in (4, 5):
        assert _same(checkpoint.read(checkpoint.path_for(tmp_path, r)), _ckpt(r, r % 2 == 0))


def test_a_file_whose_footer_names_another_round_is_skipped(tmp_path: Path):
    checkpoint.save(tmp_path, _ckpt(1))
    old = checkpoint.save(tmp_path, _ckpt(2))
    # A recycled file torn before any of its new bytes reached the disk: round 2's bytes
    # under round 3's name must not pass for round 3, nor outrank round 2's own file.
    os.replace(old, checkpoint.path_for(tmp_path, 3))
    checkpoint.save(tmp_path, _ckpt(2))
    loaded = checkpoint.load(tmp_path)
    assert loaded is not None and loaded.round == 2


def _footer(path: Path) -> tuple[bytes, dict]:
    """The file's bytes before its footer, and the footer."""
    data = path.read_bytes()
    trailer = data[-checkpoint.TRAILER_BYTES :]
    length = int.from_bytes(trailer[:8], "little")
    start = len(data) - checkpoint.TRAILER_BYTES - length
    return data[:start], json.loads(data[start : start + length])


def _with_footer(path: Path, body: bytes, footer: dict) -> None:
    text = json.dumps(footer).encode()
    path.write_bytes(body + text + len(text).to_bytes(8, "little") + checkpoint.MAGIC)


def test_a_residual_byte_damaged_fails_its_integrity_digest(tmp_path: Path):
    path = checkpoint.save(tmp_path, _ckpt(3))
    body, footer = _footer(path)
    assert footer["format"] == 4
    assert footer["digests"]["residual"] == integrity_digest(_ckpt(3).downlink_residual)
    assert footer["digests"]["weights"] == weights_digest(_ckpt(3).weights)
    first = footer["sections"]["residual"][0]["offset"]
    damaged = bytearray(body)
    damaged[first + 5] ^= 0x10
    _with_footer(path, bytes(damaged), footer)
    with pytest.raises(ValueError, match="residual do not match"):
        checkpoint.read(path)


def test_a_format_2_checkpoint_with_sha256_everywhere_still_loads(tmp_path: Path):
    path = checkpoint.save(tmp_path, _ckpt(5))
    body, footer = _footer(path)
    footer["format"] = 2
    footer["digests"]["weights"] = sha256_weights_digest(_ckpt(5).weights)
    footer["digests"]["residual"] = sha256_weights_digest(_ckpt(5).downlink_residual)
    _with_footer(path, body, footer)
    loaded = checkpoint.load(tmp_path)
    assert loaded is not None and _same(loaded, _ckpt(5))
    footer["digests"]["residual"] = integrity_digest(_ckpt(5).downlink_residual)
    _with_footer(path, body, footer)  # format 2 never held the integrity digest
    with pytest.raises(ValueError, match="residual do not match"):
        checkpoint.read(path)


def test_a_format_3_checkpoint_with_the_sha256_weights_digest_still_loads(tmp_path: Path):
    path = checkpoint.save(tmp_path, _ckpt(6))
    body, footer = _footer(path)
    footer["format"] = 3
    _with_footer(path, body, footer)
    with pytest.raises(ValueError, match="weights do not match"):  # format 3 held sha256
        checkpoint.read(path)
    footer["digests"]["weights"] = sha256_weights_digest(_ckpt(6).weights)
    _with_footer(path, body, footer)
    loaded = checkpoint.load(tmp_path)
    assert loaded is not None and _same(loaded, _ckpt(6))

"""Atomic round checkpoints: a checkpoint on disk is always whole, or absent.

Written to a temporary file in the same directory, fsynced, renamed over ``latest.pt``,
and the directory fsynced: a kill at any instant leaves the previous checkpoint intact.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from skyfed.files import write_atomic
from skyfed.fingerprint import weights_digest

log = logging.getLogger(__name__)

FORMAT = 1
LATEST = "latest.pt"


@dataclass(slots=True)
class Checkpoint:
    """The coordinator's durable state after a closed round."""

    round: int
    """Last closed round; its aggregate is in ``weights``."""
    spec_digest: str
    weights: list[torch.Tensor]
    downlink_residual: list[torch.Tensor] | None
    outer_momentum: list[torch.Tensor] | None = None
    """The outer optimizer's momentum buffers (None: it holds none)."""


def save(directory: Path, ckpt: Checkpoint) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "format": FORMAT,
        "round": ckpt.round,
        "spec_digest": ckpt.spec_digest,
        "weights": ckpt.weights,
        "downlink_residual": ckpt.downlink_residual,
        "outer_momentum": ckpt.outer_momentum,
        "content_digest": content_digest(ckpt),
    }
    return write_atomic(directory / LATEST, lambda f: torch.save(state, f))


def content_digest(ckpt: Checkpoint) -> str:
    """sha256 over every tensor the checkpoint holds: weights, residual, momentum."""
    tensors = [*ckpt.weights, *(ckpt.downlink_residual or []), *(ckpt.outer_momentum or [])]
    return weights_digest(tensors)


def clean_stale(directory: Path) -> list[Path]:
    """Remove temporary files a save killed half-way left behind (``files.write_atomic``
    names them ``.latest.pt.<hex>.tmp``); the checkpoint itself is never touched."""
    stale = sorted(directory.glob(f".{LATEST}.*.tmp")) if directory.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
        log.warning("[Coordinator.Checkpoint] removed stale temporary file %s", path)
    return stale


def check_room(directory: Path, checkpoint_bytes: int) -> None:
    """Refuse to start unless ``directory`` has room for two checkpoints: a save writes
    the new one beside the old before the rename (docs/operations.md, "Checkpoints")."""
    probe = directory if directory.exists() else directory.parent
    free = shutil.disk_usage(probe).free
    if free < 2 * checkpoint_bytes:
        raise RuntimeError(
            f"checkpoint_dir {directory} has {free / 2**20:.1f} MiB free; a save needs room "
            f"for two checkpoints, {2 * checkpoint_bytes / 2**20:.1f} MiB: free space or "
            "choose another --checkpoint-dir"
        )


def load(directory: Path) -> Checkpoint | None:
    """The latest checkpoint, or None if there is none; a damaged one is a clear error."""
    path = directory / LATEST
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a damaged file
        raise RuntimeError(
            f"checkpoint {path} cannot be read ({exc}); move it away to start over"
        ) from exc
    if state.get("format") != FORMAT:
        raise RuntimeError(f"checkpoint {path} has format {state.get('format')}, expected {FORMAT}")
    ckpt = Checkpoint(
        round=int(state["round"]),
        spec_digest=str(state["spec_digest"]),
        weights=list(state["weights"]),
        downlink_residual=state["downlink_residual"],
        outer_momentum=state.get("outer_momentum"),  # absent in checkpoints before it
    )
    recorded = state.get("content_digest")
    if recorded is None:
        log.warning("[Coordinator.Checkpoint] %s predates content digests: not verified", path)
    elif recorded != content_digest(ckpt):
        raise RuntimeError(
            f"checkpoint {path} is damaged: its tensors do not match the digest it was saved "
            "with; restore it from a backup or move it away to start over"
        )
    return ckpt

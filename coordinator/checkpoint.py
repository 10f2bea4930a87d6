"""Atomic round checkpoints: a checkpoint on disk is always whole, or absent.

Written to a temporary file in the same directory, fsynced, renamed over ``latest.pt``,
and the directory fsynced: a kill at any instant leaves the previous checkpoint intact.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from skyfed.files import write_atomic

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
    }
    return write_atomic(directory / LATEST, lambda f: torch.save(state, f))


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
    return Checkpoint(
        round=int(state["round"]),
        spec_digest=str(state["spec_digest"]),
        weights=list(state["weights"]),
        downlink_residual=state["downlink_residual"],
        outer_momentum=state.get("outer_momentum"),  # absent in checkpoints before it
    )

"""A site's own state across restarts: its error-feedback residuals in logical coordinates.

Each rank holds the residuals of the slices it encodes (``skyfed.agent.uplink``), keyed by
its layout's slices. The state file holds them as whole logical tensors instead, so a site
that comes back with another layout (1 x 1 -> 2 x 2, FSDP2 -> DDP) cuts them into its new
slices: the unsent work is resharded, not dropped (docs/sites.md). Written atomically,
0600, after every applied round; a file for another model is ignored with a warning.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from skyfed.agent.parallelize import narrow
from skyfed.files import write_atomic
from skyfed.fingerprint import TensorInfo, spec_digest
from skyfed.wire import ShardCoords

log = logging.getLogger(__name__)

STATE_FILE = "site-state.pt"
VERSION = 1
PRIVATE = 0o600

Slice = tuple[int, ShardCoords, torch.Tensor]
"""A residual as one rank holds it: (tensor index, its slice, the slice's values)."""


@dataclass(slots=True)
class SiteState:
    """What the state file holds."""

    round: int
    """The last round the site applied when it was written."""
    model: str
    """``spec_digest`` of the model it belongs to."""
    residuals: dict[str, torch.Tensor]
    """Error-feedback residuals by tensor name, in logical shape (zeros where no slice
    had one)."""


def assemble(spec: list[TensorInfo], slices: Iterable[Slice]) -> dict[str, torch.Tensor]:
    """Every rank's residual slices as whole logical tensors, by name."""
    out: dict[str, torch.Tensor] = {}
    for index, shard, values in slices:
        info = spec[index]
        full = out.get(info.name)
        if full is None:
            full = out[info.name] = torch.zeros(info.shape)
        narrow(full, shard).copy_(values)
    return out


def save(state_dir: Path, state: SiteState) -> Path:
    """Write ``state`` to ``state_dir/site-state.pt`` atomically, readable by us only."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(
        {
            "version": VERSION,
            "round": state.round,
            "model": state.model,
            "residuals": state.residuals,
        },
        buffer,
    )
    return write_atomic(state_dir / STATE_FILE, buffer.getvalue(), mode=PRIVATE)


def load(state_dir: Path, spec: list[TensorInfo]) -> SiteState | None:
    """The state of ``spec``'s model, or None (no file, or one this model cannot use:
    a warning says which)."""
    path = state_dir / STATE_FILE
    if not path.exists():
        return None
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: training goes on without it
        log.warning("[Agent.State] %s is unreadable (%s); starting without residuals", path, exc)
        return None
    model = spec_digest(spec)
    if not isinstance(raw, dict) or raw.get("version") != VERSION or raw.get("model") != model:
        log.warning(
            "[Agent.State] %s belongs to another model or version; starting without residuals",
            path,
        )
        return None
    shapes = {t.name: tuple(t.shape) for t in spec}
    residuals = {
        name: tensor
        for name, tensor in raw["residuals"].items()
        if shapes.get(name) == tuple(tensor.shape) and tensor.dtype == torch.float32
    }
    return SiteState(int(raw["round"]), model, residuals)

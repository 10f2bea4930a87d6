"""Fingerprints of a model's architecture and of its weights, in logical coordinates."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One parameter as the federation sees it: its full (unsharded) shape."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def model_spec(named: Iterable[tuple[str, torch.Tensor]]) -> list[TensorInfo]:
    """The architecture fingerprint: names, shapes, dtypes of every parameter, in order."""
    return [TensorInfo(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named]


def spec_digest(spec: Sequence[TensorInfo]) -> str:
    """A short hash of a spec, for logs and error messages."""
    text = ";".join(f"{t.name}:{'x'.join(map(str, t.shape))}:{t.dtype}" for t in spec)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def weights_digest(tensors: Iterable[torch.Tensor]) -> str:
    """sha256 over the raw bytes of every tensor in order: equal digests mean bit-identical."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def describe_mismatch(ours: Sequence[TensorInfo], theirs: Sequence[TensorInfo]) -> str:
    """The first difference between two specs, in words an operator can act on."""
    if len(ours) != len(theirs):
        return f"the federation's model has {len(ours)} tensors, yours has {len(theirs)}"
    for a, b in zip(ours, theirs, strict=True):
        if a != b:
            return (
                f"tensor {a.name} {list(a.shape)} {a.dtype} in the federation's model, "
                f"{b.name} {list(b.shape)} {b.dtype} in yours"
            )
    return "the models match"

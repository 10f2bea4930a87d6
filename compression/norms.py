"""Sums of squares and finiteness of large float32 tensors, cheap enough to run on every
payload a coordinator receives and every residual a codec releases."""

from __future__ import annotations

import math

import torch

NORM_BLOCK = 1 << 14
"""Elements per float32 partial sum of :func:`squared_norm`."""


def squared_norm(x: torch.Tensor) -> float:
    """``sum(x**2)``: float32 norms of 16k-element blocks, their squares summed in float64.
    Within ~1e-5 (relative) of a float64 pass, all a norm bound needs, at 1/15 of its cost:
    ``dtype=float64`` converts every element first (94 ms for 25M elements on this host,
    6 ms blocked)."""
    flat = x.reshape(-1)
    if flat.dtype != torch.float32:
        return float(torch.linalg.vector_norm(flat, dtype=torch.float64)) ** 2
    full = flat.numel() - flat.numel() % NORM_BLOCK
    blocks = torch.linalg.vector_norm(flat[:full].view(-1, NORM_BLOCK), dim=1)
    tail = torch.linalg.vector_norm(flat[full:], dtype=torch.float64)
    return float(blocks.double().square().sum()) + float(tail) ** 2


def all_finite(x: torch.Tensor) -> bool:
    """No NaN or Inf: one reduction (NaN propagates into min and max, Inf shows in one),
    10x cheaper here than ``isfinite(x).all()``, which writes a bool per element first."""
    if not x.numel():
        return True
    low, high = torch.aminmax(x)
    return math.isfinite(float(low)) and math.isfinite(float(high))

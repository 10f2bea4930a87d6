"""Exact top-k selection on large tensors from a sampled threshold, without a full sort."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

log = logging.getLogger(__name__)

# Below this size, or above this density, torch.topk is as fast as sampling.
_EXACT_NUMEL = 1 << 16
_EXACT_DENSITY = 0.2
_SAMPLE_FRACTION = 0.01
_MIN_SAMPLE = 4096
_OVERSAMPLE = 1.3
# A candidate set up to this many times k is accepted: topk on it stays cheap.
_MAX_CANDIDATES = 3.0
_ATTEMPTS = 4


class TopKSelector:
    """Indices of the ``k`` largest ``|x|``, exactly the set ``torch.topk`` returns.

    As in Deep Gradient Compression (Lin et al. 2018): estimate the threshold ``t`` as the
    ``1.3 * k * m / n``-th largest magnitude of a strided sample of ``m ~ n / 100``
    elements, take the candidates ``|x| >= t`` (re-estimating ``t`` when their count is
    below ``k`` or far above it), and run an exact top-k on the candidates only. Every
    element of the true top-k has ``|x| >= t`` once ``count >= k``, so the result is
    exact. Buffers for ``|x|`` and the mask are reused across calls (fresh 64 MB tensors
    cost several times a copy).
    """

    def __init__(self) -> None:
        self._abs_N = torch.empty(0)
        self._mask_N = torch.empty(0, dtype=torch.bool)

    def select(self, flat_N: torch.Tensor, k: int) -> torch.Tensor:
        """Sorted int64 indices of the ``k`` largest magnitudes of the 1-D ``flat_N``."""
        n = flat_N.numel()
        if k == 0:
            return torch.zeros(0, dtype=torch.int64)
        abs_N = self._buffer_abs(n)
        torch.abs(flat_N, out=abs_N)
        if n <= _EXACT_NUMEL or k >= _EXACT_DENSITY * n:
            return _sorted(torch.topk(abs_N, k, sorted=False).indices)
        candidates = self._candidates(abs_N, k)
        if candidates is None:
            log.debug("sampled threshold failed (n=%d k=%d); exact top-k", n, k)
            return _sorted(torch.topk(abs_N, k, sorted=False).indices)
        return _exact_top(candidates, abs_N[candidates], k)

    def _candidates(self, abs_N: torch.Tensor, k: int) -> torch.Tensor | None:
        """Indices with ``|x| >= t`` for a sampled ``t`` where ``k <= count <= 3k``."""
        n = abs_N.numel()
        stride = max(1, n // max(_MIN_SAMPLE, int(n * _SAMPLE_FRACTION))) | 1  # odd stride
        sample_M = abs_N[::stride].contiguous()
        m = sample_M.numel()
        rank = min(m, math.ceil(_OVERSAMPLE * k * m / n) + 1)
        mask_N = self._buffer_mask(n)
        for _ in range(_ATTEMPTS):
            threshold = torch.kthvalue(sample_M, m - rank + 1).values
            if float(threshold) <= 0.0:
                return None
            torch.ge(abs_N, threshold, out=mask_N)
            candidates = np.flatnonzero(mask_N.numpy())  # sorted; its length is the count
            count = len(candidates)
            if k <= count <= _MAX_CANDIDATES * k:
                return torch.from_numpy(candidates)
            if count < k and rank == m:
                return None
            rank = min(m, max(1, math.ceil(rank * _OVERSAMPLE * k / max(count, 1))))
        return None

    def _buffer_abs(self, n: int) -> torch.Tensor:
        if self._abs_N.numel() != n:
            self._abs_N = torch.empty(n)
        return self._abs_N

    def _buffer_mask(self, n: int) -> torch.Tensor:
        if self._mask_N.numel() != n:
            self._mask_N = torch.empty(n, dtype=torch.bool)
        return self._mask_N


def _sorted(indices: torch.Tensor) -> torch.Tensor:
    return torch.sort(indices).values


def _exact_top(candidates_C: torch.Tensor, abs_C: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` of the sorted ``candidates_C`` with the largest ``abs_C``, still sorted.

    Keeps order by thresholding at the k-th largest value instead of sorting indices;
    among values tied at that threshold the lowest indices win.
    """
    kth = torch.kthvalue(abs_C, abs_C.numel() - k + 1).values
    above = abs_C > kth
    ties_needed = k - int(torch.count_nonzero(above))
    if ties_needed:
        tied = torch.nonzero(abs_C == kth).view(-1)[:ties_needed]
        above[tied] = True
    return candidates_C[above]

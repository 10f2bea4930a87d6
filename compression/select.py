"""Top-k selection on large tensors: every element above a sampled threshold, no sort."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from skyfed.compression.base import BLOCK_NUMEL, SCRATCH, in_parallel, spans

log = logging.getLogger(__name__)

# Below this size, or above this density, torch.topk is as fast as sampling.
_EXACT_NUMEL = 1 << 16
_EXACT_DENSITY = 0.2
# A selection keeps between k and k * (1 + OVERSHOOT) elements (docs/codecs-performance.md).
OVERSHOOT = 0.03
_SAMPLE_FRACTION = 0.02
_MIN_SAMPLE = 4096
_RUN = 16  # float32 elements per 64-byte cache line
_ATTEMPTS = 3


class TopKSelector:
    """Indices of the ``k``-odd largest ``|x|``: all ``|x| >= t`` for a sampled ``t``.

    As in Deep Gradient Compression (Lin et al. 2018) the threshold ``t`` is a quantile
    of a strided sample of ``m ~ n / 50`` elements, aimed at ``k (1 + OVERSHOOT / 2)``
    elements; the count over the whole tensor is accepted when it lands in
    ``[k, k (1 + OVERSHOOT)]`` (a 2 % sample gives it within 0.75 % RMS at 5 % density)
    and the sample's rank is rescaled and counted again when not. The set kept is then
    exactly the top ``count`` (every element at or above ``t``), a superset of the top
    ``k``. A threshold that cannot land in the band (ties, a mostly-zero tensor) falls
    back to ``torch.topk``'s exact ``k``. ``torch.topk`` itself sorts its way to 5 % of a
    16M tensor in about 30 copies' time; one thresholding pass costs about two.
    """

    def select(
        self, flat_N: torch.Tensor, k: int, *, add_N: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sorted int64 indices of at least ``k`` of the largest magnitudes of the 1-D
        ``flat_N``; with ``add_N``, ``flat_N += add_N`` first, fused into the same pass."""
        n = flat_N.numel()
        if k >= n or n <= _EXACT_NUMEL or k >= _EXACT_DENSITY * n:
            if add_N is not None:
                flat_N.add_(add_N)
            return _exact(flat_N, k)
        sample_M = _sample_abs(flat_N, add_N, n)
        target = k * (1 + OVERSHOOT / 2)
        rank = math.ceil(target * sample_M.numel() / n)
        mask_N = SCRATCH.take("topk-mask", n, torch.bool)
        parts = spans(n)
        pending_add = add_N
        for _ in range(_ATTEMPTS):
            threshold = _quantile(sample_M, rank)
            if threshold <= 0.0:
                break
            count = threshold_pass(flat_N, pending_add, threshold, mask_N, parts)
            pending_add = None
            if k <= count <= k * (1 + OVERSHOOT):
                return _nonzero(mask_N, parts)
            # The count over the tensor scales with the sample's rank of the threshold.
            at_or_above = int(torch.count_nonzero(sample_M >= threshold))
            rescaled = max(1, round(at_or_above * target / max(count, 1)))
            if rescaled == rank:
                break
            rank = rescaled
        if pending_add is not None:
            flat_N.add_(pending_add)
        log.debug("no sampled threshold keeps k=%d of n=%d; exact top-k", k, n)
        return _exact(flat_N, k)


def _sample_abs(flat_N: torch.Tensor, add_N: torch.Tensor | None, n: int) -> torch.Tensor:
    """``|p|`` on every ``stride``-th run of ``_RUN`` elements (a 64-byte cache line):
    a strided sample of single elements reads a line per element, 16 times the memory.
    The stride is odd, so the runs do not line up with the rows of a matrix."""
    runs = n // _RUN
    stride = max(1, runs * _RUN // max(_MIN_SAMPLE, int(n * _SAMPLE_FRACTION))) | 1
    sample_M = flat_N[: runs * _RUN].view(runs, _RUN)[::stride].clone()
    if add_N is not None:
        sample_M += add_N[: runs * _RUN].view(runs, _RUN)[::stride]
    return sample_M.view(-1).abs_()


def _quantile(sample_M: torch.Tensor, rank: int) -> float:
    """The ``rank``-th largest sample value (rank clamped to the sample)."""
    m = sample_M.numel()
    return float(torch.kthvalue(sample_M, m - min(m, max(1, rank)) + 1).values)


def threshold_pass(
    flat_N: torch.Tensor,
    add_N: torch.Tensor | None,
    threshold: float,
    mask_N: torch.Tensor,
    parts: list[tuple[int, int]],
) -> int:
    """``mask = |flat| >= threshold`` (after ``flat += add``) and its count: block by block
    in cache, each span of ``parts`` on its own thread (numpy: one core per span)."""
    flat, mask = flat_N.numpy(), mask_N.numpy()
    add = None if add_N is None else add_N.numpy()

    def span(lo: int, hi: int) -> int:
        abs_B = SCRATCH.take("topk-abs", min(BLOCK_NUMEL, hi - lo)).numpy()
        count = 0
        for start in range(lo, hi, BLOCK_NUMEL):
            stop = min(start + BLOCK_NUMEL, hi)
            p_B = flat[start:stop]
            if add is not None:
                np.add(p_B, add[start:stop], out=p_B)  # p = e + g: IEEE float32, as torch's
            a_B = np.abs(p_B, out=abs_B[: stop - start])
            count += int(np.count_nonzero(np.greater_equal(a_B, threshold, out=mask[start:stop])))
        return count

    return sum(in_parallel(span, parts))


def _nonzero(mask_N: torch.Tensor, parts: list[tuple[int, int]]) -> torch.Tensor:
    """The sorted int64 indices of ``mask_N``'s set elements, a span per thread."""
    mask = mask_N.numpy()

    def span(lo: int, hi: int) -> np.ndarray:
        found = np.flatnonzero(mask[lo:hi])
        return found + lo if lo else found

    found = in_parallel(span, parts)
    return torch.from_numpy(found[0] if len(found) == 1 else np.concatenate(found))


def _exact(flat_N: torch.Tensor, k: int) -> torch.Tensor:
    """Exactly ``k`` indices, sorted (ties broken as torch.topk breaks them)."""
    if k == 0:
        return torch.zeros(0, dtype=torch.int64)
    if k >= flat_N.numel():
        return torch.arange(flat_N.numel())
    abs_N = flat_N.abs()  # rare: not worth a buffer kept per thread
    return torch.sort(torch.topk(abs_N, k, sorted=False).indices).values

"""Top-k selection on large tensors: every element above a sampled threshold, no sort."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

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
# Every this many elements of a sample are looked at for zeros before a quantile.
_ZEROS_PROBE = 61
# The smallest positive float32: ``|p| >= _TINY`` is ``p != 0`` (and not NaN).
_TINY = float(np.finfo(np.float32).smallest_subnormal)


class TopKSelector:
    """Indices of the ``k``-odd largest ``|x|``: all ``|x| >= t`` for a sampled ``t``.

    As in Deep Gradient Compression (Lin et al. 2018) the threshold ``t`` is a quantile
    of a strided sample of ``m ~ n / 50`` elements, aimed at ``k (1 + OVERSHOOT / 2)``
    elements; the count over the whole tensor is accepted when it lands in
    ``[k, k (1 + OVERSHOOT)]`` (a 2 % sample gives it within 0.75 % RMS at 5 % density)
    and the sample's rank is rescaled and counted again when not. The set kept is then
    exactly the top ``count`` (every element at or above ``t``), a superset of the top
    ``k``. A threshold the caller already counted (Top-k's plan over a set of tensors) is
    tried first, with no sample. A sampled threshold of zero (fewer than ``k`` non-zeros)
    keeps every non-zero: the rest would send zeros. A threshold that cannot land in the
    band (ties) falls back to ``torch.topk``'s exact ``k``. ``torch.topk`` itself sorts
    its way to 5 % of a 16M tensor in about 30 copies' time; one thresholding pass costs
    about two, and gathers the kept indices and values as it goes (block by block, in
    cache: no mask of the tensor's size is written or read again).
    """

    def select(
        self,
        flat_N: torch.Tensor,
        k: int,
        *,
        add_N: torch.Tensor | None = None,
        threshold: float | None = None,
    ) -> torch.Tensor:
        """Sorted int64 indices of at least ``k`` of the largest magnitudes of the 1-D
        ``flat_N``; with ``add_N``, ``flat_N += add_N`` first, fused into the same pass."""
        return self.select_kept(flat_N, k, add_N=add_N, threshold=threshold)[0]

    def select_kept(
        self,
        flat_N: torch.Tensor,
        k: int,
        *,
        add_N: torch.Tensor | None = None,
        threshold: float | None = None,
        min_k: int = 1,
        k_of: Callable[[int], int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`select`'s indices and ``flat_N``'s values there (after the sum). With
        ``threshold``, every ``|p| >= threshold`` when that is ``k`` elements. With
        ``k_of`` too, ``k = k_of(count)`` of that threshold's count, taken by this pass:
        a plan's threshold, which keeps what it counts unless ``k_of`` says otherwise
        (the selection below then runs for that ``k``, as it would have with no
        threshold). Fewer than ``k`` are kept only when the rest are zeros, and never
        fewer than ``min_k``."""
        n = flat_N.numel()
        parts = spans(n)
        pending_add = add_N
        if threshold is not None and threshold > 0.0 and (k_of is not None or 0 < k < n):
            count, found = _pass(flat_N, pending_add, threshold, parts, collect=True)
            pending_add = None
            if k_of is not None:
                k = k_of(count)
            if 0 < k < n and k <= count <= k * (1 + OVERSHOOT):
                return _joined(found)
        if n > _EXACT_NUMEL and _EXACT_DENSITY * n <= k < n:
            # A dense k over a sparse tensor: the broadcast of many agents' Top-k mean
            # holds at most agents x k_up non-zeros against a k of agents x k_up. Keep the
            # non-zeros, as a zero sampled threshold does below, rather than torch.topk's
            # copies of the tensor's size (1.4x the model at the close with 8 agents:
            # tests/test_memory_ratios.py). The sample says when a pass is worth it.
            sample_M = _sample_abs(flat_N, pending_add, n)
            if int(torch.count_nonzero(sample_M)) * n <= k * sample_M.numel():
                count, found = _pass(flat_N, pending_add, _TINY, parts, collect=True)
                pending_add = None
                if min_k <= count <= k * (1 + OVERSHOOT):
                    return _joined(found)
        if k >= n or n <= _EXACT_NUMEL or k >= _EXACT_DENSITY * n:
            if pending_add is not None:
                flat_N.add_(pending_add)
            return _exact(flat_N, k)
        sample_M = _sample_abs(flat_N, pending_add, n)
        target = k * (1 + OVERSHOOT / 2)
        rank = math.ceil(target * sample_M.numel() / n)
        for _ in range(_ATTEMPTS):
            threshold = quantile(sample_M, rank)
            if threshold <= 0.0:  # the sample is mostly zeros: keep the non-zeros if k holds them
                count, found = _pass(flat_N, pending_add, _TINY, parts, collect=True)
                pending_add = None
                if min_k <= count <= k * (1 + OVERSHOOT):
                    return _joined(found)
                break
            count, found = _pass(flat_N, pending_add, threshold, parts, collect=True)
            pending_add = None
            if k <= count <= k * (1 + OVERSHOOT):
                return _joined(found)
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


def quantile(sample_M: torch.Tensor, rank: int) -> float:
    """The ``rank``-th largest value of a contiguous float32 sample (rank clamped to the
    sample), found by partitioning the sample in place: its order may change, its values
    do not. ``torch.kthvalue`` copies the sample and makes an int64 index of its size (16 MB
    at the plan's 1M elements, a quarter of a 16M model) and is 10x slower."""
    m = sample_M.numel()
    rank = min(m, max(1, rank))
    values = sample_M.numpy()
    # Mostly zeros (a sparse mean's |p|, the first rounds of a downlink's residual): numpy's
    # introselect slows on the ties, 18x at 85 % zeros over the plan's 1M. The zeros are
    # the smallest: the rank-th largest is among the rest, or a zero. A strided look
    # says when to count (a count over the sample costs as much as the partition).
    probe = values[::_ZEROS_PROBE]
    if np.count_nonzero(probe) * 2 < len(probe) and values.min() >= 0.0:
        positive = int(np.count_nonzero(values))
        if rank > positive:
            return 0.0
        if positive * 2 < m:
            values = values[values != 0]
            m = positive
    at = m - rank
    values.partition(at)
    return float(values[at])


def _pass(
    flat_N: torch.Tensor,
    add_N: torch.Tensor | None,
    threshold: float,
    parts: list[tuple[int, int]],
    *,
    collect: bool,
) -> tuple[int, list[tuple[np.ndarray, np.ndarray]]]:
    """``#{|flat| >= threshold}`` (after ``flat += add``) and, with ``collect``, per block
    the indices and values at or above it: block by block in cache, each span of ``parts``
    on its own thread (numpy: one core per span)."""
    flat = flat_N.numpy()
    add = None if add_N is None else add_N.numpy()

    def span(lo: int, hi: int) -> tuple[int, list[tuple[np.ndarray, np.ndarray]]]:
        size = min(BLOCK_NUMEL, hi - lo)
        abs_B = SCRATCH.take("topk-abs", size).numpy()
        mask_B = SCRATCH.take("topk-mask", size, torch.bool).numpy()
        count, found = 0, []
        for start in range(lo, hi, BLOCK_NUMEL):
            stop = min(start + BLOCK_NUMEL, hi)
            p_B = flat[start:stop]
            if add is not None:
                np.add(p_B, add[start:stop], out=p_B)  # p = e + g: IEEE float32, as torch's
            a_B = np.abs(p_B, out=abs_B[: stop - start])
            m_B = np.greater_equal(a_B, threshold, out=mask_B[: stop - start])
            if not collect:
                count += int(np.count_nonzero(m_B))
                continue
            at_B = true_at(m_B)
            count += len(at_B)
            found.append((at_B + start, p_B[at_B]))
        return count, found

    done = in_parallel(span, parts)
    return sum(c for c, _ in done), [f for _, span_found in done for f in span_found]


def true_at(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(mask)`` of a 1-D bool array, 2x faster at a few percent.

    At or below 10 % true numpy's nonzero looks for each true byte with a ``memchr``
    (about 30 ns an element found, 0.33 ms for 5 % of 2^18); above that it runs a
    branch-free loop. So at a sparse density find the 4-byte words holding a true byte
    first (a quarter of the elements, ~19 % of them true at 5 %: the branch-free loop),
    then the true bytes among those words' bytes.
    """
    n = len(mask)
    head = n - n % 4
    if head == 0 or np.count_nonzero(mask) * 10 > n:
        return np.flatnonzero(mask)
    words = mask[:head].view(np.uint32)
    at_w = np.flatnonzero(np.not_equal(words, 0))
    at_byte = np.flatnonzero(words[at_w].view(np.bool_))
    at = at_w[at_byte >> 2]
    at *= 4
    at += at_byte & 3
    if head < n:
        at = np.concatenate([at, np.flatnonzero(mask[head:]) + head])
    return at


def _joined(found: list[tuple[np.ndarray, np.ndarray]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The blocks' indices and values, in order, as two tensors."""
    if len(found) == 1:
        idx, kept = found[0]
    else:
        idx = np.concatenate([i for i, _ in found])
        kept = np.concatenate([v for _, v in found])
    return torch.from_numpy(idx.astype(np.int64, copy=False)), torch.from_numpy(kept)


def _exact(flat_N: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exactly ``k`` indices, sorted (ties broken as torch.topk breaks them), and the
    values there."""
    if k == 0:
        idx = torch.zeros(0, dtype=torch.int64)
    elif k >= flat_N.numel():
        idx = torch.arange(flat_N.numel())
    else:
        abs_N = flat_N.abs()  # rare: not worth a buffer kept per thread
        idx = torch.sort(torch.topk(abs_N, k, sorted=False).indices).values
    return idx, flat_N[idx]

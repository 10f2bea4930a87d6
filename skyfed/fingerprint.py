"""Fingerprints of a model's architecture and of its weights, in logical coordinates."""

from __future__ import annotations

import hashlib
import math
import os
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

# The weights digest hashes fixed blocks of each tensor's bytes and then the list of block
# hashes (docs/scale.md, Digests): blocks hash in parallel (hashlib drops the GIL), and the
# result does not depend on how many threads ran. 8 MiB: a 400 MB model gives ~50 blocks,
# enough to keep both cores busy; per-block overhead is negligible at that size.
DIGEST_BLOCK_BYTES = 8 << 20
DIGEST_VERSION = b"skyfed-weights-v3"
"""The tag of :func:`weights_digest`'s tree (crc32 blocks, since v3)."""
DIGEST_PREFIX = "w3:"
"""What every :func:`weights_digest` starts with: a peer whose digest does not is from
before v3 (a bare sha256 tree) and is refused in one line, not resynced round after round
(docs/protocol.md, Weights digest)."""
SHA256_VERSION = b"skyfed-weights-v2"
"""The tag of the sha256 tree that named the weights before v3; checkpoints of format 2
and 3 are still verified with it (:func:`sha256_weights_digest`)."""
INTEGRITY_VERSION = b"skyfed-integrity-v1"
"""The tag of :func:`integrity_digest`'s tree (crc32 blocks), a checkpoint's sections
beyond the weights."""
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


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
    """The weights' identity: ``DIGEST_PREFIX`` and a tree over the raw bytes of every
    tensor in order; equal digests mean bit-identical weights, up to a crc32 collision.

    Each tensor's bytes are cut into ``DIGEST_BLOCK_BYTES`` blocks, each block's crc32
    taken in parallel (zlib drops the GIL), and the digest is sha256 over a version tag,
    each tensor's byte length and its block crcs. Read in place (no copy of a contiguous
    CPU tensor); ``tensors`` may be a generator (TP gathers one tensor at a time): each is
    hashed as it comes.

    crc32, not sha256, per block (since v3, docs/scale.md, Digests): both ends compute it
    every round, and what it has to catch is two authenticated peers' weights drifting
    apart (a bug, a nondeterministic kernel, a torn file), never a forgery: an agent cannot
    write the coordinator's weights, and a collision crafted against an unkeyed hash stored
    beside the bytes proves nothing either way. A block that differs escapes with
    probability 2**-32 (every burst of up to 32 bits is caught). Over 400 MB on the digest
    pool crc32 costs about half of sha256's CPU.
    """
    stream = DigestStream()
    for t in tensors:
        stream.add(t)
    return stream.hexdigest()


def sha256_weights_digest(tensors: Iterable[torch.Tensor]) -> str:
    """The sha256 tree that was the weights digest before v3 (no prefix): only to verify
    checkpoints of format 2 and 3 (``coordinator/checkpoint.py``)."""
    stream = DigestStream(kind="sha256")
    for t in tensors:
        stream.add(t)
    return stream.hexdigest()


def is_weights_digest(digest: str) -> bool:
    """True if ``digest`` is :func:`weights_digest`'s kind (a peer of this protocol)."""
    return digest.startswith(DIGEST_PREFIX)


def integrity_digest(tensors: Iterable[torch.Tensor]) -> str:
    """:func:`weights_digest`'s tree under its own tag, without the prefix: what a
    checkpoint's downlink residual and outer momentum are verified against on load
    (docs/scale.md, Digests), so the two never pass for each other.

    Those bytes never leave the coordinator and name nothing to anyone: the digest only
    has to catch a torn or damaged file, which a crc32 per 8 MiB block does (every burst of
    up to 32 bits, else all but 2**-32 of damaged blocks), and no unkeyed digest stored
    beside the data could stop one who can write the file. crc32 is the cheapest of
    Python's own: over 400 MB here 0.18 CPU-s against sha256's 0.28-0.34 (adler32 0.23),
    ~0.15 CPU-s a round at 100M parameters for the coordinator's residual.
    """
    stream = DigestStream(kind="integrity")
    for t in tensors:
        stream.add(t)
    return stream.hexdigest()


class DigestStream:
    """:func:`weights_digest` (``kind`` "integrity": :func:`integrity_digest`, "sha256":
    :func:`sha256_weights_digest`) fed one tensor at a time, as each becomes final: its
    blocks hash on the pool while the caller goes on (the coordinator hashes each tensor of
    the round's weights while it encodes the next). A tensor added must not change until
    :meth:`hexdigest` returns."""

    def __init__(self, kind: str = "weights") -> None:
        self._pending: list[tuple[int, list[Future[bytes]]]] = []
        self._prefix, self._version, self._block = _KINDS[kind]

    def add(self, t: torch.Tensor) -> None:
        raw = _bytes_of(t)
        pool = _digest_pool()
        blocks = [
            pool.submit(self._block, raw[i : i + DIGEST_BLOCK_BYTES])
            for i in range(0, len(raw), DIGEST_BLOCK_BYTES)
        ]
        self._pending.append((len(raw), blocks))

    def hexdigest(self) -> str:
        top = hashlib.sha256(self._version)
        for nbytes, blocks in self._pending:
            top.update(nbytes.to_bytes(8, "little"))
            for block in blocks:
                top.update(block.result())
        return self._prefix + top.hexdigest()


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy where it already is a contiguous CPU tensor."""
    t = t.detach()
    if t.device.type != "cpu" or not t.is_contiguous():
        t = t.contiguous().cpu()
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _block_digest(block: memoryview) -> bytes:
    return hashlib.sha256(block).digest()


def _block_crc32(block: memoryview) -> bytes:
    return zlib.crc32(block).to_bytes(4, "little")  # zlib drops the GIL for large buffers


_KINDS: dict[str, tuple[str, bytes, Callable[[memoryview], bytes]]] = {
    "weights": (DIGEST_PREFIX, DIGEST_VERSION, _block_crc32),
    "integrity": ("", INTEGRITY_VERSION, _block_crc32),
    "sha256": ("", SHA256_VERSION, _block_digest),
}
"""Per :class:`DigestStream` kind: the digest's prefix, its tree's tag, its block hash."""


def _digest_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = max(1, min(4, len(os.sched_getaffinity(0))))
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="digest")
        return _pool


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

"""Round checkpoints, written beside the broadcast and verified on load (docs/scale.md,
Checkpoints).

A checkpoint is one file per round, ``round-<n>.ckpt``: a JSON header (round, model,
tensor layout, the sha256-tree digests of the weights and the residual) and the tensors'
raw bytes. :class:`CheckpointWriter` writes it on its own thread while the aggregate's
chunks are on their way, in two steps:

1. *written*: every byte is in the file under a temporary name, then renamed into place.
   From here a kill of the coordinator loses nothing (the kernel holds the pages), so
   the round's ``RoundEnd`` (the message that makes agents apply it) waits for this step.
2. *durable*: the file and its directory are fsynced; only then are older checkpoints
   deleted. A host crash (power loss) before this step can leave the newest file torn:
   loading verifies the digests and falls back to the newest file that verifies.

Why not fsync before the broadcast, as before: at 100M parameters the file is 800 MB and
this host's disk writes ~140 MB/s fsynced (5-6 s), more than a whole round.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from skyfed import failpoints
from skyfed.fingerprint import weights_digest

log = logging.getLogger(__name__)

FORMAT = 2
MAGIC = b"SKYFEDCK"
SUFFIX = ".ckpt"
PREFIX = "round-"
ALIGN = 64
WRITE_SLICE_BYTES = 64 << 20
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(slots=True)
class Checkpoint:
    """The coordinator's durable state after a closed round."""

    round: int
    """Last closed round; its aggregate is in ``weights``."""
    spec_digest: str
    weights: list[torch.Tensor]
    downlink_residual: list[torch.Tensor] | None


def path_for(directory: Path, round_: int) -> Path:
    return directory / f"{PREFIX}{round_:09d}{SUFFIX}"


def save(directory: Path, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` and make it durable before returning (tests, tools)."""
    return write(directory, ckpt)


def write(
    directory: Path, ckpt: Checkpoint, digest: str | None = None, *, sync: bool = True
) -> Path:
    """Write ``ckpt`` whole under its round's name (fsynced when ``sync``); ``digest`` is
    the weights' digest when the caller has it already (it is computed every round)."""
    directory.mkdir(parents=True, exist_ok=True)
    residual = ckpt.downlink_residual
    header = {
        "format": FORMAT,
        "round": ckpt.round,
        "spec_digest": ckpt.spec_digest,
        "weights_digest": digest or weights_digest(ckpt.weights),
        "residual_digest": None if residual is None else weights_digest(residual),
        "tensors": [],
    }
    tensors = [*ckpt.weights, *(residual or [])]
    offset = 0
    for t in tensors:
        header["tensors"].append(
            {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "offset": offset}
        )
        offset += _padded(t.numel() * t.element_size())
    header["weights"], header["residual"] = len(ckpt.weights), len(residual or [])
    head = json.dumps(header).encode()
    preamble = MAGIC + len(head).to_bytes(8, "little") + head
    preamble += b"\0" * (_padded(len(preamble)) - len(preamble))
    target = path_for(directory, ckpt.round)
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "wb", buffering=0) as f:
        f.write(preamble)
        for t in tensors:
            raw = _raw(t)
            for start in range(0, len(raw), WRITE_SLICE_BYTES):
                f.write(raw[start : start + WRITE_SLICE_BYTES])
            pad = _padded(len(raw)) - len(raw)
            if pad:
                f.write(b"\0" * pad)
            failpoints.reached("checkpoint", ckpt.round)  # a file half written
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, target)
    if sync:
        fsync_dir(directory)
    return target


def load(directory: Path) -> Checkpoint | None:
    """The newest checkpoint whose digests verify, or None if there is none at all.

    A newer file that does not verify (torn by a host crash before its fsync) is skipped
    with a warning; if no file verifies, that is a clear error, nothing is guessed.
    """
    candidates = sorted(directory.glob(f"{PREFIX}*{SUFFIX}"), reverse=True)
    if not candidates:
        return None
    problems = []
    for path in candidates:
        try:
            ckpt = read(path)
        except (OSError, ValueError) as exc:
            problems.append(f"{path.name}: {exc}")
            log.warning("[Coordinator.Checkpoint] skipping %s: %s", path, exc)
            continue
        return ckpt
    raise RuntimeError(
        f"no checkpoint in {directory} verifies ({'; '.join(problems)}); move them away to "
        "start over"
    )


def read(path: Path) -> Checkpoint:
    """One checkpoint file, verified against its digests; ValueError if it does not."""
    with open(path, "rb", buffering=0) as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a skyfed checkpoint")
        head_len = int.from_bytes(f.read(8), "little")
        if head_len > 1 << 24:
            raise ValueError(f"header of {head_len} bytes")
        header = json.loads(f.read(head_len))
        if header.get("format") != FORMAT:
            raise ValueError(f"format {header.get('format')}, expected {FORMAT}")
        base = _padded(len(MAGIC) + 8 + head_len)
        tensors = []
        for entry in header["tensors"]:
            t = torch.empty(entry["shape"], dtype=_DTYPES[entry["dtype"]])
            f.seek(base + entry["offset"])
            want = t.numel() * t.element_size()
            if want and f.readinto(_raw(t)) != want:
                raise ValueError("file is truncated")
            tensors.append(t)
    n = header["weights"]
    weights, residual = tensors[:n], tensors[n:] if header["residual"] else None
    if weights_digest(weights) != header["weights_digest"]:
        raise ValueError("weights do not match their digest")
    if residual is not None and weights_digest(residual) != header["residual_digest"]:
        raise ValueError("residual does not match its digest")
    return Checkpoint(
        round=int(header["round"]),
        spec_digest=str(header["spec_digest"]),
        weights=weights,
        downlink_residual=residual,
    )


@dataclass(slots=True)
class WriteTimes:
    """How long the last checkpoint took, ms: to be whole in the file, then to be durable."""

    round: int = -1
    written_ms: float = 0.0
    durable_ms: float = 0.0


class CheckpointWriter:
    """Writes one checkpoint at a time on a thread of its own (see the module docstring).

    The caller hands over its live tensors, not copies: it must not change them until
    :meth:`wait_written` returns (the federation changes them only at the next round's
    close, and :meth:`submit` itself waits for the previous write first).
    """

    def __init__(self, directory: Path, keep: int = 2) -> None:
        self.directory = directory
        self.keep = max(1, keep)
        self.times = WriteTimes()
        self._written = threading.Event()
        self._written.set()
        self._error: BaseException | None = None
        # Files written, to fsync in order: (path, round, started, written_ms); None stops.
        self._to_sync: queue.Queue[tuple[Path, int, float, float] | None] = queue.Queue()
        self._syncer: threading.Thread | None = None
        for stale in directory.glob(f".{PREFIX}*{SUFFIX}.tmp"):  # a write a crash cut short
            stale.unlink(missing_ok=True)

    def submit(self, ckpt: Checkpoint, digest: str) -> None:
        """Start writing ``ckpt`` (whose weights have ``digest``) and return at once."""
        self.wait_written()
        self._written.clear()
        if self._syncer is None:
            self._syncer = threading.Thread(target=self._sync_loop, name="fsync", daemon=True)
            self._syncer.start()
        threading.Thread(
            target=self._write, args=(ckpt, digest), name="checkpoint", daemon=True
        ).start()

    def wait_written(self, timeout: float | None = None) -> None:
        """Block until the last submitted checkpoint is whole on disk (a kill keeps it);
        re-raises the writer's error, if it failed."""
        if not self._written.wait(timeout):
            raise TimeoutError(f"checkpoint not written within {timeout} s")
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"checkpoint write failed: {error}") from error

    def close(self) -> None:
        """Wait for the last checkpoint to be durable (a clean stop leaves it fsynced)."""
        self.wait_written()
        if self._syncer is not None:
            self._to_sync.put(None)
            self._syncer.join()
            self._syncer = None

    def _write(self, ckpt: Checkpoint, digest: str) -> None:
        started = time.perf_counter()
        try:
            path = write(self.directory, ckpt, digest, sync=False)
        except BaseException as exc:  # noqa: BLE001 - handed to the round's thread
            self._error = exc
            self._written.set()
            return
        self._to_sync.put((path, ckpt.round, started, (time.perf_counter() - started) * 1000))
        self._written.set()

    def _sync_loop(self) -> None:
        while (job := self._to_sync.get()) is not None:
            self._sync(*job)

    def _sync(self, path: Path, round_: int, started: float, written_ms: float) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(self.directory)
        except OSError as exc:
            log.error("[Coordinator.Checkpoint] fsync of %s failed: %s", path, exc)
            return
        durable_ms = (time.perf_counter() - started) * 1000
        self.times = WriteTimes(round_, written_ms, durable_ms)
        log.info(
            "[Coordinator.Checkpoint] round=%d written_ms=%.0f durable_ms=%.0f",
            round_,
            written_ms,
            durable_ms,
        )
        older = [p for p in sorted(self.directory.glob(f"{PREFIX}*{SUFFIX}")) if p < path]
        for old in older[: max(0, len(older) - self.keep + 1)]:
            old.unlink(missing_ok=True)  # the newest durable ones stay, ``keep`` in all


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _padded(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _raw(t: torch.Tensor) -> memoryview:
    if t.numel() == 0:
        return memoryview(bytearray())
    return memoryview(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())

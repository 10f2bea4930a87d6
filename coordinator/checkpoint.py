"""Round checkpoints, written beside the broadcast and verified on load (docs/scale.md,
Checkpoints).

A checkpoint is one file per round, ``round-<n>.ckpt``: the tensors' raw bytes (the
weights, then the downlink residual, then the outer optimizer's momentum), then a JSON
footer (round, model, tensor layout, each section's digest: the weights' sha256 tree, the
others' crc32 tree, :func:`section_digest`), its length
and a magic.
:class:`CheckpointWriter` writes it on its own thread, each tensor as soon as the round
has finished with it (while later tensors are still being encoded and the aggregate's
chunks are on their way), in two steps:

1. *written*: every byte is in the file under a temporary name, then renamed into place.
   From here a kill of the coordinator loses nothing (the kernel holds the pages), so
   the round's ``RoundEnd`` (the message that makes agents apply it) waits for this step.
2. *durable*: the file and its directory are fsynced; only then are older checkpoints
   deleted. A host crash (power loss) before this step can leave the newest file torn:
   loading verifies the digests and falls back to the newest file that verifies.

Why not fsync before the broadcast, as before: at 100M parameters the file is 800 MB and
this host's disk writes ~140 MB/s fsynced (5-6 s), more than a whole round.

The oldest file, once it is no longer kept, becomes the *spare* the next checkpoint is
written into: overwriting pages the kernel already holds costs 0.07 CPU-s for 400 MB on
this host, new pages 0.91 (docs/scale.md, Checkpoints). A
file is only recycled once a newer one is durable, and loading refuses a file whose footer
names another round than its name, so a torn recycled file never passes for its old self.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from skyfed import failpoints
from skyfed.files import PRIVATE_MODE, private_opener
from skyfed.fingerprint import integrity_digest, sha256_weights_digest, weights_digest

log = logging.getLogger(__name__)

FORMAT = 4
"""4: the weights verified by ``weights_digest`` (v3, crc32 blocks: the digest agents
compare), the residual and momentum by ``integrity_digest``; still read: 3 (the weights by
the sha256 tree before v3) and 2 (every section by it; docs/scale.md, Digests)."""
READABLE = (2, 3, 4)
MAGIC = b"SKYFEDCK"
SUFFIX = ".ckpt"
PREFIX = "round-"
ALIGN = 64
WRITE_SLICE_BYTES = 64 << 20
TRAILER_BYTES = 8 + len(MAGIC)
SPARE = f".{PREFIX}spare{SUFFIX}.tmp"
"""An old checkpoint's file waiting to be overwritten by the next (a stale temporary file
to :func:`clean_stale`, so a restart starts without one)."""
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SECTIONS = ("weights", "residual", "outer")
"""The weights, the downlink residual, the outer optimizer's momentum: each one tensor per
model tensor (the last two may be absent), laid out in this order."""


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
    norms: list[float] = field(default_factory=list)
    """The window of recent accepted update norms (``coordinator/robust.py``): a restart
    clips from its first round as the run before it would have."""


def path_for(directory: Path, round_: int) -> Path:
    return directory / f"{PREFIX}{round_:09d}{SUFFIX}"


def save(directory: Path, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` and make it durable before returning (tests, tools)."""
    writer = CheckpointWriter(directory)
    writer.submit(ckpt, weights_digest(ckpt.weights))
    writer.close()
    return path_for(directory, ckpt.round)


def section_digest(section: str, tensors: list[torch.Tensor], fmt: int = FORMAT) -> str:
    """What a checkpoint of format ``fmt`` holds for ``section``: the weights' own digest
    (the one agents compare; before format 4 the sha256 tree it was), the integrity digest
    for the rest from format 3."""
    if fmt < 3 or (section == "weights" and fmt < 4):
        return sha256_weights_digest(tensors)
    if section == "weights":
        return weights_digest(tensors)
    return integrity_digest(tensors)


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
            return read(path)
        except (OSError, ValueError, KeyError) as exc:
            problems.append(f"{path.name}: {exc}")
            log.warning("[Coordinator.Checkpoint] skipping %s: %s", path, exc)
    raise RuntimeError(
        f"no checkpoint in {directory} verifies, each is damaged ({'; '.join(problems)}): "
        "restore one from a backup or move them away to start over"
    )


def read(path: Path) -> Checkpoint:
    """One checkpoint file, verified against its digests; ValueError if it does not."""
    with open(path, "rb", buffering=0) as f:
        size = f.seek(0, os.SEEK_END)
        if size < TRAILER_BYTES:
            raise ValueError("file is truncated")
        f.seek(size - TRAILER_BYTES)
        trailer = f.read(TRAILER_BYTES)
        if trailer[8:] != MAGIC:
            raise ValueError("not a whole skyfed checkpoint (no trailer)")
        foot_len = int.from_bytes(trailer[:8], "little")
        if foot_len > min(size, 1 << 24):
            raise ValueError(f"footer of {foot_len} bytes")
        f.seek(size - TRAILER_BYTES - foot_len)
        footer = json.loads(f.read(foot_len))
        fmt = footer.get("format")
        if fmt not in READABLE:
            raise ValueError(f"format {fmt}, expected one of {READABLE}")
        if path.name.startswith(PREFIX) and path != path_for(path.parent, int(footer["round"])):
            raise ValueError(f"holds round {footer['round']}: a recycled file torn before its end")
        sections: dict[str, list[torch.Tensor]] = {}
        for section in SECTIONS:
            for entry in footer["sections"].get(section) or []:
                t = torch.empty(entry["shape"], dtype=_DTYPES[entry["dtype"]])
                want = t.numel() * t.element_size()
                f.seek(entry["offset"])
                if want and f.readinto(_raw(t)) != want:
                    raise ValueError("file is truncated")
                sections.setdefault(section, []).append(t)
    for section, tensors in sections.items():
        if section_digest(section, tensors, fmt) != footer["digests"][section]:
            raise ValueError(f"{section} do not match their digest")
    norms = footer.get("norms", [])
    if not isinstance(norms, list) or not all(
        isinstance(n, int | float) and math.isfinite(n) and n >= 0 for n in norms
    ):
        raise ValueError("its clipping window is not a list of finite norms")
    return Checkpoint(
        norms=[float(n) for n in norms],
        round=int(footer["round"]),
        spec_digest=str(footer["spec_digest"]),
        weights=sections.get("weights", []),
        downlink_residual=sections.get("residual"),
        outer_momentum=sections.get("outer"),
    )


@dataclass(slots=True)
class WriteTimes:
    """How long the last checkpoint took, ms from its first tensor: whole in the file,
    then durable."""

    round: int = -1
    written_ms: float = 0.0
    durable_ms: float = 0.0


@dataclass(slots=True)
class _Round:
    """The checkpoint being written: where each tensor goes, what was written."""

    round: int
    spec_digest: str
    shapes: list[tuple[int, ...]]
    tmp: Path
    started: float
    entries: dict[str, dict[int, dict]]
    end: int = 0
    """Bytes used so far, the footer's offset once every tensor is in."""
    recycled: bool = False
    """Written into the spare (pages the kernel holds), not a new file."""
    cpu_s: float = 0.0
    """The writer thread's CPU time when it opened the file (``time.thread_time``)."""


class CheckpointWriter:
    """Writes one checkpoint at a time on a thread of its own (see the module docstring):
    :meth:`begin` a round, :meth:`add` each tensor once the round is done with it,
    :meth:`finish` with the digests, :meth:`wait_written` before the round's end goes out.

    It is handed live tensors, not copies: the caller must not change a tensor added
    until :meth:`wait_written` returns (the federation changes them only at the next
    round's close, after waiting).
    """

    def __init__(self, directory: Path, keep: int = 2) -> None:
        self.directory = directory
        self.keep = max(1, keep)
        self.times = WriteTimes()
        self._written = threading.Event()
        self._written.set()
        self._error: BaseException | None = None
        self._jobs: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        # Files written, to fsync in order: (path, round, started, written_ms); None stops.
        self._to_sync: queue.Queue[tuple[Path, int, float, float] | None] = queue.Queue()
        self._syncer: threading.Thread | None = None
        clean_stale(directory)

    def begin(self, round_: int, spec_digest: str, shapes: list[tuple[int, ...]]) -> None:
        """Start round ``round_``'s file; ``shapes`` are the model's tensors' shapes."""
        self.wait_written()
        self._written.clear()
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="checkpoint", daemon=True)
            self._writer.start()
            self._syncer = threading.Thread(target=self._sync_loop, name="fsync", daemon=True)
            self._syncer.start()
        target = path_for(self.directory, round_)
        self._jobs.put(
            _Round(
                round=round_,
                spec_digest=spec_digest,
                shapes=[tuple(s) for s in shapes],
                tmp=target.with_name(f".{target.name}.tmp"),
                started=time.perf_counter(),
                entries={section: {} for section in SECTIONS},
            )
        )

    def add(self, section: str, index: int, tensor: torch.Tensor) -> None:
        """Queue tensor ``index`` of ``section`` (one of :data:`SECTIONS`) for writing."""
        if section not in SECTIONS:
            raise ValueError(f"checkpoint section {section!r} is not one of {SECTIONS}")
        self._jobs.put((section, index, tensor))

    def finish(self, digests: dict[str, str], norms: list[float] | None = None) -> None:
        """Every tensor is added: write the footer (``digests``: each section's
        :func:`weights_digest`; ``norms``: the clipping window) and name the file (on the
        thread)."""
        self._jobs.put(("finish", dict(digests), list(norms or [])))

    def submit(self, ckpt: Checkpoint, digest: str) -> None:
        """A whole checkpoint at once: :meth:`begin`, every :meth:`add`, :meth:`finish`."""
        self.begin(ckpt.round, ckpt.spec_digest, [tuple(w.shape) for w in ckpt.weights])
        digests = {"weights": digest}
        named = zip(
            SECTIONS, (ckpt.weights, ckpt.downlink_residual, ckpt.outer_momentum), strict=True
        )
        for section, tensors in named:
            for i, t in enumerate(tensors or []):
                self.add(section, i, t)
            if tensors and section != "weights":
                digests[section] = section_digest(section, tensors)
        self.finish(digests, ckpt.norms)

    def wait_written(self, timeout: float | None = None) -> None:
        """Block until the last checkpoint is whole on disk (a kill keeps it);
        re-raises the writer's error, if it failed."""
        if not self._written.wait(timeout):
            raise TimeoutError(f"checkpoint not written within {timeout} s")
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"checkpoint write failed: {error}") from error

    def close(self) -> None:
        """Wait for the last checkpoint to be durable (a clean stop leaves it fsynced)."""
        self.wait_written()
        if self._writer is not None:
            self._jobs.put(None)
            self._writer.join()
            self._writer = None
        if self._syncer is not None:
            self._to_sync.put(None)
            self._syncer.join()
            self._syncer = None

    # ---- the writer's thread -------------------------------------------------------------

    def _write_loop(self) -> None:
        current: _Round | None = None
        f = None
        while (job := self._jobs.get()) is not None:
            try:
                if isinstance(job, _Round):
                    current = job
                    job.tmp.parent.mkdir(parents=True, exist_ok=True)
                    current.cpu_s = time.thread_time()
                    f, current.recycled = self._open(job.tmp)
                    current.end = 0
                elif current is None or f is None:
                    continue  # a failed round: drop its jobs until the next begins
                elif job[0] == "finish":
                    self._finish(current, f, job[1], job[2])
                    current, f = None, None
                else:
                    section, index, tensor = job
                    self._write_tensor(current, f, section, index, tensor)
            except BaseException as exc:  # noqa: BLE001 - handed to the round's thread
                with contextlib.suppress(OSError):
                    if f is not None:
                        f.close()
                    if current is not None:
                        current.tmp.unlink(missing_ok=True)
                current, f = None, None
                self._error = exc
                self._written.set()

    def _open(self, tmp: Path):  # noqa: ANN202 - a raw binary file
        """``tmp`` opened for writing, and whether it is recycled: the spare file if there
        is one (its pages are overwritten in place, then it is cut to size at the footer),
        else a new file."""
        try:
            os.replace(self.directory / SPARE, tmp)
            os.chmod(tmp, PRIVATE_MODE)  # a spare from before checkpoints were private
            return open(tmp, "r+b", buffering=0), True  # noqa: SIM115 - closed at finish
        except FileNotFoundError:  # 0600: the weights are the operator's (docs/security.md)
            return open(tmp, "wb", buffering=0, opener=private_opener), False  # noqa: SIM115

    def _offset(self, r: _Round, section: str, index: int) -> int:
        """Weights first, each tensor aligned, then each further section in the same layout."""
        offset = 0
        n = len(r.shapes)
        for k in range(n * SECTIONS.index(section) + index):
            shape = r.shapes[k % n]
            numel = 1
            for d in shape:
                numel *= d
            offset += _padded(numel * 4)
        return offset

    def _write_tensor(self, r: _Round, f, section: str, index: int, t: torch.Tensor) -> None:
        offset = self._offset(r, section, index)
        raw = _raw(t)
        f.seek(offset)
        for start in range(0, len(raw), WRITE_SLICE_BYTES):
            f.write(raw[start : start + WRITE_SLICE_BYTES])
        r.entries[section][index] = {
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "offset": offset,
        }
        r.end = max(r.end, _padded(offset + len(raw)))
        failpoints.reached("checkpoint", r.round)  # a file half written

    def _finish(self, r: _Round, f, digests: dict[str, str], norms: list[float]) -> None:
        complete = list(range(len(r.shapes)))
        sections = {}
        for section in SECTIONS:
            entries = r.entries[section]
            if not entries:
                continue
            if sorted(entries) != complete:
                raise ValueError(f"checkpoint of round {r.round} misses part of its {section}")
            if section not in digests:
                raise ValueError(f"checkpoint of round {r.round} has no digest of its {section}")
            sections[section] = [entries[i] for i in complete]
        if "weights" not in sections and complete:
            raise ValueError(f"checkpoint of round {r.round} has no weights")
        sections.setdefault("weights", [])
        footer = {
            "format": FORMAT,
            "round": r.round,
            "spec_digest": r.spec_digest,
            "sections": sections,
            "digests": {k: v for k, v in digests.items() if k in sections},
            "norms": norms,
        }
        text = json.dumps(footer).encode()
        f.seek(r.end)
        f.write(text + len(text).to_bytes(8, "little") + MAGIC)
        f.truncate()
        f.close()
        target = path_for(self.directory, r.round)
        os.replace(r.tmp, target)
        written_ms = (time.perf_counter() - r.started) * 1000
        self._to_sync.put((target, r.round, r.started, written_ms))
        self._written.set()
        # The writer's CPU: new page-cache pages cost ~10x pages the spare holds here
        # (docs/scale.md, Checkpoints); a run's first rounds have no spare yet.
        log.info(
            "[Coordinator.Checkpoint] round=%d write_cpu_ms=%.0f recycled=%s",
            r.round,
            (time.thread_time() - r.cpu_s) * 1000,
            r.recycled,
        )

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
        dropped = older[: max(0, len(older) - self.keep + 1)]
        for old in dropped[:-1]:
            old.unlink(missing_ok=True)  # the newest durable ones stay, ``keep`` in all
        if dropped:  # the newest of those left is the next checkpoint's file
            with contextlib.suppress(FileNotFoundError):
                os.replace(dropped[-1], self.directory / SPARE)


def clean_stale(directory: Path) -> list[Path]:
    """Remove the temporary files a write killed half-way left behind; a checkpoint
    itself is never touched."""
    stale = sorted(directory.glob(f".{PREFIX}*{SUFFIX}.tmp")) if directory.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
        if path.name != SPARE:  # a spare is left by every clean stop
            log.warning("[Coordinator.Checkpoint] removed stale temporary file %s", path)
    return stale


def check_room(directory: Path, checkpoint_bytes: int) -> None:
    """Refuse to start unless ``directory`` has room for two more checkpoints: the next
    one is written beside the newest durable ones before they are deleted
    (docs/scale.md, Checkpoints)."""
    probe = directory if directory.exists() else directory.parent
    free = shutil.disk_usage(probe).free
    if free < 2 * checkpoint_bytes:
        raise RuntimeError(
            f"checkpoint_dir {directory} has {free / 2**20:.1f} MiB free; a save needs room "
            f"for two checkpoints, {2 * checkpoint_bytes / 2**20:.1f} MiB: free space or "
            "choose another --checkpoint-dir"
        )


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

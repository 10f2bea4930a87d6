"""The weights digest's cost: the tree digest against one sha256 over copies, and crc32.

    python bench/digest.py [--mb 400] [--record WHAT]

Over ``--mb`` MB of float32 weights in four tensors (the wide task's shape at 100M), the
best of 3: ``weights_digest`` (crc32 tree over 8 MiB blocks on a thread pool, read in
place, since v3), the sha256 tree it was before (``sha256_weights_digest``), the oldest form (one sha256 over each tensor's ``tobytes()`` copy), and sha256 and
crc32 over the same bytes in place, on one thread and on two. ``isfinite().all()``
against ``aminmax`` for the aggregate's finiteness check, on one of the tensors.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from skyfed.fingerprint import DIGEST_BLOCK_BYTES, sha256_weights_digest, weights_digest


def best_s(fn: Callable[[], object], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=400, help="Megabytes of float32 weights.")
    parser.add_argument("--record", metavar="WHAT", help="Also write bench/results/...md.")
    args = parser.parse_args(argv)
    numel = args.mb * 10**6 // 4 // 4
    weights = [torch.randn(numel) for _ in range(4)]
    views = [memoryview(w.view(torch.uint8).numpy()) for w in weights]
    blocks = [
        v[i : i + DIGEST_BLOCK_BYTES] for v in views for i in range(0, len(v), DIGEST_BLOCK_BYTES)
    ]

    def old() -> str:
        h = hashlib.sha256()
        for w in weights:
            h.update(w.contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    with ThreadPoolExecutor(2) as pool:
        rows = [
            ("weights_digest (crc32 tree, pool)", best_s(lambda: weights_digest(weights))),
            ("sha256 tree, pool (before v3)", best_s(lambda: sha256_weights_digest(weights))),
            ("old: sha256 over tobytes() copies", best_s(old)),
            (
                "sha256 in place, 1 thread",
                best_s(lambda: [hashlib.sha256(v).digest() for v in views]),
            ),
            ("crc32 in place, 1 thread", best_s(lambda: [zlib.crc32(v) for v in views])),
            (
                "sha256 in place, 2 threads",
                best_s(lambda: list(pool.map(lambda b: hashlib.sha256(b).digest(), blocks))),
            ),
            ("crc32 in place, 2 threads", best_s(lambda: list(pool.map(zlib.crc32, blocks)))),
            (
                "isfinite(x).all(), one tensor",
                best_s(lambda: bool(torch.isfinite(weights[0]).all())),
            ),
            ("aminmax(x), one tensor", best_s(lambda: torch.aminmax(weights[0]))),
        ]
    lines = [f"{args.mb} MB of float32 in 4 tensors, best of 3", "", "| what | s |", "|---|---|"]
    lines += [f"| {name} | {s:.3f} |" for name, s in rows]
    print("\n".join(lines))
    if args.record:
        sys.path.insert(0, str(Path(__file__).parent))
        from results_file import record  # one way to write a results file

        raw = sys.argv[1:] if argv is None else argv
        print(f"recorded in {record('digest', args.record, raw, lines)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

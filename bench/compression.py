"""Codec benchmark: wire ratio and encode/decode time against a plain copy, in one run.

    python bench/compression.py                 # 1M, 16M and 64M float32 elements
    python bench/compression.py --sizes 1M,4M   # smaller, for a quick look

Times are the best of ``--repeats`` runs. Decode writes into a reused output tensor
(``decode(payload, out=...)``) and encode into a reused ``PayloadBuffer``
(``encode(x, out=...)``), as a round loop can; ``enc bytes`` is encode returning fresh
``bytes`` instead (what protobuf fields need), and ``(e+d)/copy`` is given both ways.
``copy`` is ``dst.copy_(src)`` for the same tensor, timed in the same run. Goals (issue 3)
are checked at 16M elements, on the buffer path; the bytes path is printed beside them.
On a shared machine other work inflates every cell: compare rows of one run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from skyfed.compression import Codec, make_codec
from skyfed.compression.frame import PayloadBuffer

CODECS: list[tuple[str, dict[str, object]]] = [
    ("fp32", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("topk", {"density": 0.05}),  # the default under exchange = "delta"
    ("topk", {"density": 0.01}),
    ("topk", {"density": 0.001}),
    ("topk", {"density": 0.01, "values": "fp16"}),
    ("ecsgd", {"bits": 1}),
    ("ecsgd", {"bits": 2}),
    ("ecsgd", {"bits": 4}),
]
GOAL_NUMEL = 16 << 20


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    numel: int
    ratio: float
    encode_ms: float  # into a reused PayloadBuffer
    encode_bytes_ms: float  # into fresh bytes
    decode_ms: float
    copy_ms: float

    @property
    def multiple(self) -> float:
        return (self.encode_ms + self.decode_ms) / self.copy_ms

    @property
    def bytes_multiple(self) -> float:
        return (self.encode_bytes_ms + self.decode_ms) / self.copy_ms


@dataclass(frozen=True, slots=True)
class Goal:
    label: str
    min_ratio: float | None = None
    max_multiple: float | None = None

    def check(self, row: Row) -> tuple[str, bool]:
        if self.min_ratio is not None:
            return f"{self.label} ratio >= {self.min_ratio:g}x", row.ratio >= self.min_ratio
        assert self.max_multiple is not None
        text = (
            f"{self.label} encode+decode <= {self.max_multiple:g}x copy: "
            f"{row.multiple:.1f}x (into fresh bytes {row.bytes_multiple:.1f}x)"
        )
        return text, row.multiple <= self.max_multiple


GOALS = [
    Goal("topk density=0.01", min_ratio=100),
    Goal("ecsgd bits=2", min_ratio=15),
    Goal("ecsgd bits=1", min_ratio=30),
    Goal("fp16", max_multiple=2),
    Goal("topk density=0.01", max_multiple=8),
    Goal("ecsgd bits=2", max_multiple=20),
]


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm buffers and caches
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def label(name: str, params: dict[str, object]) -> str:
    return " ".join([name, *(f"{k}={v}" for k, v in params.items())])


def measure(codec: Codec, text: str, x: torch.Tensor, copy_ms: float, repeats: int) -> Row:
    payload = codec.encode(x)
    out, buffer = torch.empty_like(x), PayloadBuffer()
    encode_ms = best_ms(lambda: codec.encode(x, out=buffer), repeats)  # type: ignore[call-arg]
    encode_bytes_ms = best_ms(lambda: codec.encode(x), repeats)
    decode_ms = best_ms(lambda: codec.decode(payload, out=out), repeats)
    ratio = 4 * x.numel() / len(payload)
    return Row(text, x.numel(), ratio, encode_ms, encode_bytes_ms, decode_ms, copy_ms)


def run(sizes: list[int], repeats: int) -> list[Row]:
    rows = []
    for numel in sizes:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
        dst = torch.empty_like(x)
        copy_ms = best_ms(lambda: dst.copy_(x), repeats)  # noqa: B023
        for name, params in CODECS:
            rows.append(
                measure(make_codec(name, **params), label(name, params), x, copy_ms, repeats)
            )
    return rows


def print_table(rows: list[Row]) -> None:
    head = f"{'codec':<30}{'size':>5}{'ratio':>9}{'enc ms':>8}{'enc bytes':>10}{'dec ms':>8}"
    print(head + f"{'copy ms':>8}{'(e+d)/copy':>11}{'bytes':>7}")
    for r in rows:
        print(
            f"{r.label:<30}{size_text(r.numel):>5}{r.ratio:>8.1f}x{r.encode_ms:>8.2f}"
            f"{r.encode_bytes_ms:>10.2f}{r.decode_ms:>8.2f}{r.copy_ms:>8.2f}"
            f"{r.multiple:>10.1f}x{r.bytes_multiple:>6.1f}x"
        )


def print_goals(rows: list[Row]) -> None:
    at_goal = {r.label: r for r in rows if r.numel == GOAL_NUMEL}
    if not at_goal:
        print(f"\ngoals are checked at {size_text(GOAL_NUMEL)}; not measured in this run")
        return
    print(f"\ngoals at {size_text(GOAL_NUMEL)} elements:")
    for goal in GOALS:
        text, ok = goal.check(at_goal[goal.label])
        print(f"  {'PASS' if ok else 'FAIL'}  {text}")


def size_text(numel: int) -> str:
    return f"{numel >> 20}M" if numel % (1 << 20) == 0 else str(numel)


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text.rstrip("KM")) * scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,16M,64M", help="comma-separated, e.g. 1M,16M")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per cell (best kept)")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    rows = run(sizes, args.repeats)
    print_table(rows)
    print_goals(rows)


if __name__ == "__main__":
    main()

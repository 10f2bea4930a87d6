"""Codec benchmark: wire ratio and codec time against a plain copy, side by side in one run.

    python bench/compression.py                 # 1M and 16M float32 elements
    python bench/compression.py --sizes 16M     # the goals' size only
    flock /tmp/skyfed-heavy.lock python bench/compression.py --save   # + bench/results/
    flock /tmp/skyfed-heavy.lock python bench/compression.py --baseline main --turns 3 --save

Two ways of running each codec, each timed against ``dst.copy_(src)`` of the same tensor
in the same repeat (repeats interleave copy and codec; the best of each is kept, so a
busy host inflates both alike):

- ``plain``: ``encode(x, out=buffer)`` and ``decode(payload, out=tensor)``, the reused
  buffers of a round loop;
- ``fed``: as the federation runs them, through the functions the agents and the
  coordinator call (docs/codecs-performance.md). Sending: ``ErrorFeedback.encode``
  (the one encoder of the agents' uplink and the coordinator's downlink) with the
  key's residual from the round before, error feedback, Top-k's plan and the payload's
  memory all as the federation has them (the last round's payload acknowledged, so no
  longer held). Receiving: ``decode_add_payload(payload, acc, alpha)``, the decoded
  payload added into the round's sum in place (the coordinator's mean; an agent applying
  the broadcast to its weights, ``alpha = -1``). ``plain``'s decode into a reused buffer
  is the agents' other receiving path (loading weights, a rank's shard).

Goals are checked at 16M elements on the ``fed`` path: FP16 within 2x a copy,
Top-k at its default density (5 %) within 8x, EC-SGD 2-bit within 20x.

``--baseline REF`` runs the same measurement, in the same run, on the codecs of another
commit (``git archive REF``, imported in a child process) and this checkout's in another child,
so neither side runs in a process the other left behind, and prints both side by side;
``--turns N`` (even) measures both N times, which goes first alternating, and gives each
cell's best and the geometric mean of the turns' now / before ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from results_file import record  # bench/results_file.py, beside this script

from skyfed.compression import Codec, ErrorFeedback, decode_add_payload, make_codec
from skyfed.compression.frame import PayloadBuffer

CODECS: list[tuple[str, dict[str, object]]] = [
    ("fp32", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("topk", {"density": 0.05}),  # the default under exchange = "delta"
    ("topk", {"density": 0.05, "bits": 2}),
    ("topk", {"density": 0.05, "bits": 4}),
    ("topk", {"density": 0.01}),
    ("topk", {"density": 0.01, "bits": 2}),
    ("topk", {"density": 0.001}),
    ("ecsgd", {"bits": 1}),
    ("ecsgd", {"bits": 2}),
    ("ecsgd", {"bits": 4}),
]
GOAL_NUMEL = 16 << 20
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    numel: int
    ratio: float
    encode_ms: float  # encode(x, out=buffer)
    decode_ms: float  # decode(payload, out=tensor)
    fed_encode_ms: float  # feedback.encode(codec, [(key, g)]), a residual held
    fed_decode_ms: float  # decode_add_payload(payload, acc, alpha)
    copy_ms: float

    @property
    def multiple(self) -> float:
        return (self.encode_ms + self.decode_ms) / self.copy_ms

    @property
    def fed_multiple(self) -> float:
        return (self.fed_encode_ms + self.fed_decode_ms) / self.copy_ms


@dataclass(frozen=True, slots=True)
class Goal:
    label: str
    min_ratio: float | None = None
    max_multiple: float | None = None

    def check(self, row: Row) -> tuple[str, bool]:
        if self.min_ratio is not None:
            return f"{self.label} ratio >= {self.min_ratio:g}x: {row.ratio:.1f}x", (
                row.ratio >= self.min_ratio
            )
        assert self.max_multiple is not None
        text = (
            f"{self.label} fed encode+decode <= {self.max_multiple:g}x copy: "
            f"{row.fed_multiple:.1f}x (plain {row.multiple:.1f}x)"
        )
        return text, row.fed_multiple <= self.max_multiple


GOALS = [
    Goal("topk density=0.01", min_ratio=100),
    Goal("ecsgd bits=2", min_ratio=15),
    Goal("ecsgd bits=1", min_ratio=30),
    Goal("fp16", max_multiple=2),
    Goal("topk density=0.05", max_multiple=8),
    Goal("ecsgd bits=2", max_multiple=20),
]


def best_side_by_side(fns: list[Callable[[], object]], repeats: int, reset: Callable[[], None]):
    """The best time in ms of each of ``fns``, run in turn within every repeat (``reset``,
    untimed, before each repeat)."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats + 1):  # the first warms buffers and caches
        reset()
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return [b * 1e3 for b in best]


def label(name: str, params: dict[str, object]) -> str:
    return " ".join([name, *(f"{k}={v}" for k, v in params.items())])


def measure(codec: Codec, text: str, numel: int, repeats: int) -> Row:
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(numel, generator=gen)
    residual0 = torch.randn(numel, generator=gen) * 0.1
    dst, out, acc = torch.empty(numel), torch.empty(numel), torch.zeros(numel)
    buffer = PayloadBuffer()
    payload = bytes(codec.encode(g))
    # The federation's sender: one key's residual, carried from the round before.
    feedback = ErrorFeedback()
    feedback.residuals["w"] = residual0.clone()
    fed_payload = bytes(_fed_encode(feedback, codec, g))

    def reset() -> None:
        feedback.residuals["w"].copy_(residual0)  # the same residual in every repeat

    copy_ms, enc, dec, fed_enc, fed_dec = best_side_by_side(
        [
            lambda: dst.copy_(g),
            lambda: codec.encode(g, out=buffer),
            lambda: codec.decode(payload, out=out),
            lambda: _fed_encode(feedback, codec, g),  # the payload is dropped: acknowledged
            lambda: decode_add_payload(fed_payload, acc, 3.0),  # alpha: a sample count
        ],
        repeats,
        reset=reset,
    )
    ratio = 4 * numel / len(payload)
    return Row(text, numel, ratio, enc, dec, fed_enc, fed_dec, copy_ms)


def _fed_encode(feedback: ErrorFeedback, codec: Codec, g: torch.Tensor) -> bytes:
    """One key through the federation's sender (``ErrorFeedback.encode``)."""
    ((_, payload),) = feedback.encode(codec, [("w", g)])
    return payload


def run(sizes: list[int], repeats: int, only: str = "") -> list[Row]:
    return [
        measure(make_codec(name, **params), label(name, params), numel, repeats)
        for numel in sizes
        for name, params in CODECS
        if only in label(name, params)
    ]


MEMORY_CODECS = [
    ("fp16", {}),
    ("topk", {"density": 0.05}),
    ("topk", {"density": 0.05, "bits": 2}),
    ("ecsgd", {"bits": 2}),
]


def peak_rss_growth(fn: Callable[[], object]) -> int:
    """Bytes the peak resident set grew by while ``fn`` ran (VmHWM, reset first)."""

    def hwm() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc/self/status")

    Path("/proc/self/clear_refs").write_text("5")
    before = hwm()
    fn()
    return hwm() - before


def memory(numel: int) -> list[str]:
    """Peak RSS growth per step, over the tensor's float32 bytes (the second call of each,
    so per-thread scratch that a round loop keeps is already there)."""
    lines = [
        f"peak RSS growth over the tensor's float32 bytes at {size_text(numel)} "
        "(after a first call; scratch kept per thread is not counted again):",
        f"{'codec':<24}{'decode + add_':>15}{'decode_add':>12}{'fed encode':>22}",
    ]
    for name, params in MEMORY_CODECS:
        codec = make_codec(name, **params)
        g, acc, feedback = torch.randn(numel), torch.zeros(numel), ErrorFeedback()
        feedback.residuals["w"] = torch.randn(numel) * 0.1
        payload = bytes(codec.encode(g))
        steps = [
            lambda: acc.add_(codec.decode(payload, shape=(numel,))),  # noqa: B023
            lambda: codec.decode_add(payload, acc),  # noqa: B023
            lambda: _fed_encode(feedback, codec, g),  # noqa: B023
        ]
        cells = []
        for step in steps:
            step()
            cells.append(peak_rss_growth(step) / (4 * numel))
        lines.append(
            f"{label(name, params):<24}"
            + "".join(f"{c:>{w}.2f}x" for c, w in zip(cells, (14, 11, 21), strict=True))
        )
    return lines


def table(rows: list[Row]) -> list[str]:
    head = f"{'codec':<24}{'size':>5}{'ratio':>9}{'enc':>7}{'dec':>7}{'fed enc':>9}{'fed dec':>9}"
    lines = [head + f"{'copy':>7}{'plain/copy':>11}{'fed/copy':>10}"]
    for r in rows:
        lines.append(
            f"{r.label:<24}{size_text(r.numel):>5}{r.ratio:>8.1f}x{r.encode_ms:>7.2f}"
            f"{r.decode_ms:>7.2f}{r.fed_encode_ms:>9.2f}{r.fed_decode_ms:>9.2f}"
            f"{r.copy_ms:>7.2f}{r.multiple:>10.1f}x{r.fed_multiple:>9.1f}x"
        )
    lines.append("(times in ms, best of the repeats)")
    return lines


def goals(rows: list[Row]) -> list[str]:
    at_goal = {r.label: r for r in rows if r.numel == GOAL_NUMEL}
    if not at_goal:
        return [f"goals are checked at {size_text(GOAL_NUMEL)}; not measured in this run"]
    lines = [f"goals at {size_text(GOAL_NUMEL)} elements:"]
    for goal in (g for g in GOALS if g.label in at_goal):
        text, ok = goal.check(at_goal[goal.label])
        lines.append(f"  {'PASS' if ok else 'FAIL'}  {text}")
    return lines


def size_text(numel: int) -> str:
    return f"{numel >> 20}M" if numel % (1 << 20) == 0 else str(numel)


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text.rstrip("KM")) * scale


# Run in a child process: import skyfed from the checkout at argv[1] (as the editable
# install maps it: skyfed/ and the top-level package folders), then run this bench.
_BOOT = """
import importlib.machinery, importlib.util, pathlib, runpy, sys
root = pathlib.Path(sys.argv[1])
class Checkout:
    @staticmethod
    def find_spec(name, path=None, target=None):
        parts = name.split(".")
        if parts[0] != "skyfed" or len(parts) > 2:
            return None
        if len(parts) == 1:
            where = root / "skyfed"
        elif (root / parts[1] / "__init__.py").exists() and not (root / "skyfed" / parts[1]).exists():
            where = root / parts[1]
        else:
            return importlib.machinery.PathFinder.find_spec(name, [str(root / "skyfed")])
        return importlib.util.spec_from_file_location(
            name, where / "__init__.py", submodule_search_locations=[str(where)])
sys.meta_path.insert(0, Checkout)
sys.argv = sys.argv[2:]
sys.path.insert(0, str(pathlib.Path(sys.argv[0]).parent))  # the bench's own helpers
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@contextlib.contextmanager
def checkout_of(ref: str) -> Iterator[Path]:
    """The tree of commit ``ref`` (``git archive``) in a temporary folder."""
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)


def measured_turns(
    ref: str, sizes: list[int], repeats: int, only: str, turns: int
) -> list[tuple[list[Row], list[Row]]]:
    """``(before, now)``: the rows of commit ``ref``'s codecs and of this checkout's, each
    measured in its own child process, ``turns`` times. Which side goes first alternates
    from turn to turn, so neither is the one that always runs after the other's memory
    was freed or while the host's load drifts one way."""
    out = []
    with checkout_of(ref) as old:
        for turn in range(max(1, turns)):
            sides = [old, ROOT] if turn % 2 == 0 else [ROOT, old]
            measured = {root: child_rows(root, sizes, repeats, only) for root in sides}
            out.append((measured[old], measured[ROOT]))
    return out


def child_rows(root: Path, sizes: list[int], repeats: int, only: str) -> list[Row]:
    """The rows measured in a child process on the codecs of the checkout at ``root``:
    with ``--baseline``, this checkout's are measured in a child too, so neither side
    runs in a process the other's measurement left behind."""
    sizes_text = ",".join(size_text(s) for s in sizes)
    args = ["--sizes", sizes_text, "--repeats", str(repeats), "--only", only, "--rows"]
    child = subprocess.run(
        [sys.executable, "-c", _BOOT, str(root), __file__, *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return [Row(**r) for r in json.loads(child.stdout)]


def best_rows(runs: list[list[Row]]) -> list[Row]:
    """Each cell's best time over several runs of the same rows (the copy's too)."""
    fields = ("encode_ms", "decode_ms", "fed_encode_ms", "fed_decode_ms", "copy_ms")
    return [
        replace(same[0], **{f: min(getattr(r, f) for r in same) for f in fields})
        for same in zip(*runs, strict=True)
    ]


def side_by_side(
    rows: list[Row], before: list[Row], ref: str, turns: list[tuple[list[Row], list[Row]]]
) -> list[str]:
    """Each row's fed and plain multiples of a copy, before (``ref``) and now, and the
    geometric mean over the turns of each turn's now / before fed times: the best of each
    side may come from different moments of a noisy host, where a turn's two sides ran
    minutes apart at most."""
    was = {(r.label, r.numel): r for r in before}
    lines = [
        f"before = the codecs of {ref}, measured in this run; now = this checkout",
        f"{'codec':<24}{'size':>5}{'fed enc':>9}{'fed dec':>9}{'fed/copy':>10}"
        f"{'plain/copy':>11}  |{'fed enc':>9}{'fed dec':>9}{'fed/copy':>10}{'plain/copy':>11}"
        f"  |{'enc':>6}{'dec':>6}",
        f"{'':<29}{'before':>39}  |{'now':>39}  |{'now/before':>12}",
    ]
    for r in rows:
        b = was.get((r.label, r.numel))
        if b is None:
            continue
        enc, dec = (turn_ratio(turns, r, field) for field in ("fed_encode_ms", "fed_decode_ms"))
        lines.append(
            f"{r.label:<24}{size_text(r.numel):>5}{b.fed_encode_ms:>9.2f}{b.fed_decode_ms:>9.2f}"
            f"{b.fed_multiple:>9.1f}x{b.multiple:>10.1f}x  |{r.fed_encode_ms:>9.2f}"
            f"{r.fed_decode_ms:>9.2f}{r.fed_multiple:>9.1f}x{r.multiple:>10.1f}x"
            f"  |{enc:>6.2f}{dec:>6.2f}"
        )
    if len(turns) > 1:
        lines.append(f"(now/before: the geometric mean of {len(turns)} turns' ratios of fed times)")
    return lines


def turn_ratio(turns: list[tuple[list[Row], list[Row]]], row: Row, field: str) -> float:
    """The geometric mean over ``turns`` of now's ``field`` over before's, for ``row``'s
    cell. Over an even number of turns it cancels whatever going first or second does to
    a process: on the development host a median of 5 turns one way round and 4 the other
    put FP16's unchanged fed encode at 0.43
    (bench/results/2026-12-06-compression-16m-capabilities-base-9-turns.md)."""
    ratios = []
    for before, now in turns:
        b = next(x for x in before if (x.label, x.numel) == (row.label, row.numel))
        n = next(x for x in now if (x.label, x.numel) == (row.label, row.numel))
        ratios.append(getattr(n, field) / getattr(b, field))
    return statistics.geometric_mean(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,16M", help="comma-separated, e.g. 1M,16M")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per cell (best kept)")
    parser.add_argument("--only", default="", help="only codecs whose label contains this")
    parser.add_argument("--save", action="store_true", help="also write the run to bench/results/")
    parser.add_argument(
        "--baseline",
        default="",
        metavar="REF",
        help="also measure commit REF's codecs, side by side",
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=1,
        help="with --baseline: measure REF and this checkout in turn this many times (even: "
        "which goes first alternates), keeping each cell's best (a noisy host drifts between "
        "two processes) and the geometric mean of their ratios",
    )
    parser.add_argument("--what", default="", help="the results file's <what> (default: the sizes)")
    parser.add_argument("--rows", action="store_true", help=argparse.SUPPRESS)  # JSON rows only
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.rows:
        print(json.dumps([asdict(r) for r in run(sizes, args.repeats, args.only)]))
        return
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads", ""]
    if args.baseline:
        turns = measured_turns(args.baseline, sizes, args.repeats, args.only, args.turns)
        before, rows = best_rows([b for b, _ in turns]), best_rows([r for _, r in turns])
    else:
        turns, before, rows = [], [], run(sizes, args.repeats, args.only)
    if args.turns > 1:
        lines += [
            f"best of {args.turns} turns of {args.baseline} and this checkout, which goes first "
            "alternating",
            "",
        ]
    lines += [*table(rows), "", *goals(rows), ""]
    if before:
        lines += [f"{args.baseline}:", *table(before), "", *goals(before), ""]
        lines += [*side_by_side(rows, before, args.baseline, turns), ""]
    lines += memory(max(sizes))
    print("\n".join(lines))
    if args.save:
        what = args.what or "-".join(
            [*(size_text(s).lower() for s in sizes), *[args.only] * bool(args.only)]
        )
        name = re.sub(r"[^a-z0-9.-]+", "", what.lower())
        title = f"Codecs at {', '.join(size_text(s) for s in sizes)}: plain and as the federation runs them"
        print(f"saved {record('compression', name, sys.argv[1:], ['```', *lines, '```'], title)}")


if __name__ == "__main__":
    main()

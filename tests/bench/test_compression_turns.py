"""``bench/compression.py --turns``: several turns of the same rows keep each cell's best."""

from __future__ import annotations

from tests.bench import bench_module


def test_turns_keep_each_cells_best_time_and_the_rows_order() -> None:
    bench = bench_module("compression")
    row = bench.Row("fp16", 16, 2.0, 4.0, 3.0, 5.0, 6.0, 2.0)
    first = [row, bench.Row("topk", 16, 20.0, 9.0, 8.0, 7.0, 6.0, 1.5)]
    second = [
        bench.Row("fp16", 16, 2.0, 3.0, 4.0, 6.0, 5.0, 1.0),
        bench.Row("topk", 16, 20.0, 10.0, 7.0, 8.0, 5.0, 3.0),
    ]
    best = bench.best_rows([first, second])
    assert best == [
        bench.Row("fp16", 16, 2.0, 3.0, 3.0, 5.0, 5.0, 1.0),
        bench.Row("topk", 16, 20.0, 9.0, 7.0, 7.0, 5.0, 1.5),
    ]

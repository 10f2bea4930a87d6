"""Uplinks staged past the memory budget, on disk: the same mean bit for bit, exact
withdrawal, the budget kept, and the spilled pages let go as the close reads them."""

from __future__ import annotations

import pytest
import torch

from skyfed.compression import codec_names, make_codec
from skyfed.compression.base import BLOCK_NUMEL
from skyfed.coordinator.aggregate import RoundAggregate
from skyfed.coordinator.spill import SPILL_MIN_BYTES, SpillFile
from skyfed.fingerprint import TensorInfo
from skyfed.wire import Payload

ROWS, COLS = 512, 1100  # several pieces of the close, and payloads far above the minimum
SPEC = [TensorInfo("w", (ROWS, COLS), "float32"), TensorInfo("b", (COLS,), "float32")]
MODEL_BYTES = 4 * (ROWS * COLS + COLS)
SHARDINGS = [None, [(0, 0, 200), (0, 200, ROWS - 200)], [(1, 0, 300), (1, 300, COLS - 300)]]


def contribute(agg, key, samples, gen, codec, shards=None):
    """One contribution of random values, every payload checked and staged."""
    (rows, cols), _ = (t.shape for t in agg.spec)
    w, b = torch.randn(rows, cols, generator=gen), torch.randn(cols, generator=gen)
    parts = [(0, w, None)] if shards is None else [(0, w.narrow(*s), s) for s in shards]
    c = agg.begin(samples, key)
    for tensor, values, shard in [*parts, (1, b, None)]:
        data = bytes(codec.encode(values.contiguous()))
        c.stage(c.check(Payload(tensor, shard, codec.name, data)))
    return c


def means(agg):
    return [agg.mean_into(i, torch.full(t.shape, float("nan"))) for i, t in enumerate(agg.spec)]


def same_bits(xs, ys):
    return all(
        torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(xs, ys, strict=True)
    )


@pytest.mark.parametrize("shards", SHARDINGS, ids=["whole", "rows", "columns"])
@pytest.mark.parametrize("name", codec_names())
def test_spilled_uplinks_give_the_mean_bit_for_bit(name, shards, tmp_path):
    held, spilled = RoundAggregate(SPEC), RoundAggregate(SPEC, memory_bytes=0, spill_dir=tmp_path)
    for agg in (held, spilled):
        gen = torch.Generator().manual_seed(4)
        for key, samples in (("gcp", 5), ("aws", 2), ("azure", 7)):
            codec = make_codec(name, seed=[1, samples])
            contribute(agg, key, samples, gen, codec, shards).commit()
    assert same_bits(means(spilled), means(held))
    if name == "topk":  # its check's parse is kept: nothing to gain on disk
        assert spilled.spilled == 0
    else:
        assert spilled.spilled > 0 and held.spilled == 0
        assert spilled.held < 3 * SPILL_MIN_BYTES  # only the small biases stayed


@pytest.mark.parametrize("name", ["fp16", "ecsgd"])
def test_a_withdrawn_spilled_contribution_leaves_the_sum_exactly_as_without_it(name, tmp_path):
    agg = RoundAggregate(SPEC, memory_bytes=0, spill_dir=tmp_path)
    reference = RoundAggregate(SPEC)
    for target in (agg, reference):  # EC-SGD rounds at random: the same seed for both
        gen = torch.Generator().manual_seed(9)
        contribute(target, "a", 2, gen, make_codec(name, seed=[0])).commit()
    gen = torch.Generator().manual_seed(10)
    contribute(agg, "b", 7, gen, make_codec(name, seed=[3])).withdraw()
    assert agg.held == sum(c.held for c in agg._committed)
    assert same_bits(means(agg), means(reference))


def test_the_budget_holds_what_fits_and_spills_the_rest(tmp_path):
    fp16 = make_codec("fp16")
    payload_bytes = len(fp16.encode(torch.zeros(ROWS, COLS)))
    budget = int(1.5 * payload_bytes)
    agg = RoundAggregate(SPEC, memory_bytes=budget, spill_dir=tmp_path)
    gen = torch.Generator().manual_seed(2)
    first = contribute(agg, "a", 1, gen, fp16)
    second = contribute(agg, "b", 1, gen, fp16)
    assert first.spill is None and second.spill is not None
    assert agg.held <= budget and agg.spilled >= payload_bytes
    first.withdraw()  # its memory is free again: the next one stays in memory
    third = contribute(agg, "c", 1, gen, fp16)
    assert third.spill is None and agg.held <= budget


def test_uplinks_that_cannot_be_spilled_stay_in_memory_and_count(tmp_path, caplog):
    """No directory to stage in (removed, full): the payloads are held in memory, the
    round goes on with the same mean, and the operator is told once."""
    gone = tmp_path / "removed"
    agg = RoundAggregate(SPEC, memory_bytes=0, spill_dir=gone)
    reference = RoundAggregate(SPEC)
    for target in (agg, reference):
        gen = torch.Generator().manual_seed(6)
        for key in "ab":
            contribute(target, key, 3, gen, make_codec("fp16")).commit()
    assert agg.spilled == 0 and agg.held == reference.held
    assert same_bits(means(agg), means(reference))
    assert sum("cannot stage uplinks" in r.message for r in caplog.records) == 1


def test_a_payload_past_its_files_room_stays_in_memory(tmp_path):
    file = SpillFile(tmp_path, capacity=1)
    assert file.capacity >= 1 and file.write(bytes(file.capacity + 1)) is None
    view = file.write(b"x" * 10)
    assert view is not None and bytes(view) == b"x" * 10 and view.readonly


def spill_rss_bytes(directory) -> int:
    """Resident bytes of this process's maps of the unlinked files in ``directory``."""
    total, counting = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line
                counting = len(head) >= 6 and head[5].startswith(str(directory))
            elif counting and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


def test_the_close_lets_the_spilled_pages_go_piece_by_piece(tmp_path, monkeypatch):
    """Read at the close, a spilled payload's pages are dropped after each piece: the
    process never maps much more than a piece of each contribution's payload (and the
    page cache's large folios: a fault maps a whole folio, up to 2 MiB, and a piece may
    touch two)."""
    rows, cols = 2048, 2100  # 17 MB FP32 payloads, 16 pieces
    spec = [TensorInfo("w", (rows, cols), "float32"), TensorInfo("b", (cols,), "float32")]
    agg = RoundAggregate(spec, memory_bytes=0, spill_dir=tmp_path)
    gen = torch.Generator().manual_seed(7)
    for key in "abcd":
        contribute(agg, key, 1, gen, make_codec("fp32")).commit()
    seen: list[int] = []
    forget = SpillFile.forget

    def watched(self: SpillFile) -> None:
        seen.append(spill_rss_bytes(tmp_path))
        forget(self)

    monkeypatch.setattr(SpillFile, "forget", watched)
    means(agg)
    piece_bytes, payload_bytes = 4 * BLOCK_NUMEL, 4 * rows * cols
    assert 0 < max(seen) <= 4 * (piece_bytes + 2 * 2 * 2**20)  # four contributions
    assert max(seen) < 4 * payload_bytes / 3
    assert spill_rss_bytes(tmp_path) == 0  # none left mapped after the close

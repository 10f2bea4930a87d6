"""Uplinks staged past the memory budget, on disk: the same mean bit for bit, exact
withdrawal, the budget kept, payloads put together on disk as their chunks arrive, and the
spilled pages let go as the check and the close read them."""

from __future__ import annotations

import pytest
import torch

from skyfed.compression import codec_names, make_codec
from skyfed.compression.base import BLOCK_NUMEL
from skyfed.coordinator.aggregate import RoundAggregate
from skyfed.coordinator.payload_pool import PayloadPool
from skyfed.coordinator.spill import SPILL_MIN_BYTES, SpillFile
from skyfed.fingerprint import TensorInfo
from skyfed.proto.chunks import Assembler, cut
from skyfed.wire import ChunkKind, Payload, max_payload_bytes

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


class CountingPool(PayloadPool):
    """The coordinator's payload pool, counting the bytes lent."""

    def __init__(self) -> None:
        super().__init__()
        self.lent = 0

    def take(self, nbytes: int) -> memoryview:
        self.lent += nbytes
        return super().take(nbytes)


CHUNK_BYTES = 4096  # several chunks per payload of the weight matrix, Top-k's too


def arrive(agg, key, samples, gen, codec, pool):
    """One contribution as the coordinator receives it: each payload cut into chunks and
    put together by an assembler on the contribution's memory, then checked and staged."""
    (rows, cols), _ = (t.shape for t in agg.spec)
    w, b = torch.randn(rows, cols, generator=gen), torch.randn(cols, generator=gen)
    c = agg.begin(samples, key)
    assembler = Assembler(
        kind=ChunkKind.GRADIENT,
        round=0,
        num_tensors=len(agg.spec),
        max_chunk_bytes=CHUNK_BYTES,
        max_payload_bytes=max_payload_bytes(agg.spec),
        memory=c.memory(pool.take),
    )
    seq = 0
    for tensor, values in ((0, w), (1, b)):
        payload = Payload(tensor, None, codec.name, bytes(codec.encode(values)))
        for chunk in cut(
            payload, kind=ChunkKind.GRADIENT, round=0, first_seq=seq, max_chunk_bytes=CHUNK_BYTES
        ):
            seq += 1
            whole = assembler.add(chunk)
            if whole is not None:
                c.stage(c.check(whole))
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


@pytest.mark.parametrize("name", codec_names())
def test_a_payload_past_the_budget_is_put_together_on_disk_as_it_arrives(name, tmp_path):
    """Past the budget a dense payload's chunks go straight to its file (no pool memory
    lent for it) and the mean is the in-memory one bit for bit; Top-k, whose check's parse
    the close reads, is put together in memory."""
    held, spilled = RoundAggregate(SPEC), RoundAggregate(SPEC, memory_bytes=0, spill_dir=tmp_path)
    pools = {id(held): CountingPool(), id(spilled): CountingPool()}
    for agg in (held, spilled):
        gen = torch.Generator().manual_seed(11)
        for key, samples in (("gcp", 5), ("aws", 2), ("azure", 7)):
            codec = make_codec(name, seed=[1, samples])
            arrive(agg, key, samples, gen, codec, pools[id(agg)]).commit()
    assert same_bits(means(spilled), means(held))
    assert pools[id(held)].lent > 0
    if name == "topk":
        assert spilled.spilled == 0 and pools[id(spilled)].lent > 0
    else:
        assert spilled.spilled > 0 and pools[id(spilled)].lent < 3 * SPILL_MIN_BYTES  # biases
        assert all(c.spill.holds(c.staged[0][0].data) for c in spilled._committed)
        assert spill_rss_bytes(tmp_path) == 0  # its check read it through the map: let go


def test_payloads_arriving_at_once_share_the_budget(tmp_path):
    """The budget counts a payload from its first chunk: two arriving at once with room
    for one put the second together on disk, and what was counted gives way to the real
    sizes once they are held."""
    fp16 = make_codec("fp16")
    payload_bytes = len(fp16.encode(torch.zeros(ROWS, COLS)))
    agg = RoundAggregate(SPEC, memory_bytes=int(1.5 * payload_bytes), spill_dir=tmp_path)
    first, second = agg.begin(1, "a"), agg.begin(1, "b")
    pool = CountingPool()
    in_memory = first.memory(pool.take)(payload_bytes, "fp16")
    on_disk = second.memory(pool.take)(payload_bytes, "fp16")
    assert isinstance(in_memory, memoryview) and not isinstance(on_disk, memoryview)
    assert agg.held == payload_bytes and pool.lent == payload_bytes
    first.withdraw()
    assert agg.held == 0 and first.arriving == 0


def test_a_contribution_withdrawn_while_a_payload_arrives_leaves_nothing_counted(tmp_path):
    """Withdrawn mid-payload (the round closed under it), then the payload completes and is
    checked: the budget's count returns to what the others hold, never below."""
    agg = RoundAggregate(SPEC, memory_bytes=10 * MODEL_BYTES, spill_dir=tmp_path)
    gen = torch.Generator().manual_seed(12)
    kept = arrive(agg, "a", 1, gen, make_codec("fp16"), CountingPool())
    kept.commit()
    c = agg.begin(1, "b")
    fp16 = make_codec("fp16")
    data = bytes(fp16.encode(torch.randn(ROWS, COLS, generator=gen)))
    buffer = c.memory(CountingPool().take)(len(data), "fp16")
    buffer[0 : len(data)] = data
    c.withdraw()
    c.stage(c.check(Payload(0, None, "fp16", buffer[0 : len(data)])))
    assert agg.held == kept.held > 0


def test_a_disk_with_no_room_for_an_arriving_payload_means_memory(tmp_path, caplog):
    """No directory to stage in: an arriving payload past the budget is put together in
    memory after all, counted, with one warning, and the mean is the same."""
    agg = RoundAggregate(SPEC, memory_bytes=0, spill_dir=tmp_path / "removed")
    reference = RoundAggregate(SPEC)
    for target in (agg, reference):
        gen = torch.Generator().manual_seed(13)
        for key in "ab":
            arrive(target, key, 3, gen, make_codec("fp16"), CountingPool()).commit()
    assert agg.spilled == 0 and agg.held == reference.held
    assert same_bits(means(agg), means(reference))
    assert sum("cannot stage uplinks" in r.message for r in caplog.records) == 1


def test_a_spill_region_takes_its_chunks_at_their_place(tmp_path):
    file = SpillFile(tmp_path, capacity=1 << 20)
    region = file.region(10)
    assert region is not None
    region[0:4], region[4:10] = b"abcd", b"efghij"
    view = region[0:10]
    assert bytes(view) == b"abcdefghij" and view.readonly and file.holds(view)
    with pytest.raises(ValueError):
        region[8:12] = b"xxxx"  # past its end
    assert file.region(file.capacity) is None  # no room left for that many

"""A dp x tp site's ranks on real Gloo groups (``site_worker.py``): each data-parallel mode
sends slices that add up to a 1 x 1 site's pseudo-gradient, applies an aggregate into a
bit-identical model, and encodes each slice of the model exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyfed.procs import Children

from .test_tp_ranks import check_matches_tp1, run_site

pytestmark = pytest.mark.multiprocess

MLP = "skyfed.tasks.examples:mlp_task"


def run(tmp_path: Path, kids: Children, world: int, dp: int, mode: str, task: str = MLP, **kw):
    return run_site(kids, task, tmp_path, world, dp=dp, mode=mode, **kw)


def owned(records: list[dict]) -> dict[int, dict[str, list]]:
    """What each rank encodes: tensor name -> its slice (None: whole)."""
    return {r: {name: shard for name, shard in rec["owned"]} for r, rec in enumerate(records)}


def test_2x2_fsdp_site_sends_what_a_1x1_site_sends_one_slice_per_rank(reaped, tmp_path):
    records = run(tmp_path, reaped, 4, 2, "fsdp")
    lead = records[0]
    assert lead["digest_before"] and lead["digest_after"]
    assert lead["max_delta_diff"] < 1e-6, lead["max_delta_diff"]
    # fc1 is column-sharded by TP (rows 0-63 | 64-127), then FSDP splits each TP slice
    # along the same dim: rank r = (dp r // 2, tp r % 2) holds one interval.
    slices = owned(records)
    assert [slices[r]["fc1.weight"] for r in range(4)] == [
        [0, 0, 32],
        [0, 64, 32],
        [0, 32, 32],
        [0, 96, 32],
    ]
    # fc2.weight is row-sharded by TP (dim 1): FSDP shards dim 1 too.
    assert [slices[r]["fc2.weight"][0] for r in range(4)] == [1, 1, 1, 1]
    # fc2.bias is replicated by TP: FSDP halves it, and only TP rank 0 of each replica sends.
    assert "fc2.bias" not in slices[1] and "fc2.bias" not in slices[3]
    assert (slices[0]["fc2.bias"], slices[2]["fc2.bias"]) == ([0, 0, 5], [0, 5, 5])
    assert lead["payloads_per_tensor"] == [4, 4, 4, 2]


def test_2x2_ddp_site_encodes_on_the_first_replica_only(reaped, tmp_path):
    records = run(tmp_path, reaped, 4, 2, "ddp")
    check_matches_tp1(records[0])
    assert records[0]["dp_mode"] == "ddp"
    slices = owned(records)
    assert slices[2] == {} and slices[3] == {}, "the second replica's copies are not sent"
    assert slices[1]["fc1.weight"] == [0, 64, 64]


def test_2x1_ddp_site_is_torch_ddp_and_rank_0_sends_every_tensor_whole(reaped, tmp_path):
    records = run(tmp_path, reaped, 2, 2, "ddp")
    lead = records[0]
    assert lead["digest_before"] and lead["digest_after"]
    assert lead["max_delta_diff"] < 1e-6, lead["max_delta_diff"]
    assert lead["payloads_per_tensor"] == [1, 1, 1, 1]
    assert set(owned(records)[0].values()) == {None} and owned(records)[1] == {}


def test_4x1_hsdp_site_shards_within_each_group_and_the_first_group_sends(reaped, tmp_path):
    """Two shard groups of two replicas (two nodes of two GPUs, say): FSDP2 shards within a
    group and replicates across them; each slice of the first group is sent once."""
    records = run(tmp_path, reaped, 4, 4, "hsdp:2")
    lead = records[0]
    assert records[0]["dp_mode"] == "hsdp"
    assert lead["digest_before"] and lead["digest_after"]
    assert lead["max_delta_diff"] < 1e-6, lead["max_delta_diff"]
    slices = owned(records)
    assert (slices[0]["fc1.weight"], slices[1]["fc1.weight"]) == ([0, 0, 64], [0, 64, 64])
    assert slices[2] == {} and slices[3] == {}, "the second group's copies are not sent"
    assert lead["payloads_per_tensor"] == [2, 2, 2, 2]


def test_default_task_on_a_2x2_fsdp_site_under_gradient_exchange(reaped, tmp_path):
    """chargpt: blocks as FSDP units, an embedding TP leaves plain (FSDP shards it on "dp"
    alone: TP rank 0 of each replica sends it), the momentum step slice by slice."""
    records = run(tmp_path, reaped, 4, 2, "fsdp", task="chargpt", exchange="gradient")
    lead = records[0]
    assert lead["digest_before"] and lead["digest_after"]
    assert lead["max_delta_rel_diff"] < 1e-3, lead["max_delta_rel_diff"]
    embedding = [owned(records)[r].get("tok.weight") for r in range(4)]
    assert embedding[1] is None and embedding[3] is None
    assert embedding[0][:2] == [0, 0] and embedding[2][0] == 0 and embedding[2][1] > 0

"""A site's ranks on real Gloo process groups: shards, compressed exchange, apply, digest."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.distributed as dist

from skyfed.agent.ranks import STORE_HOST
from skyfed.procs import Children

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).with_name("site_worker.py")


def run_site(
    kids: Children,
    task: str,
    out: Path,
    world: int = 2,
    exchange: str = "delta",
    *,
    dp: int = 1,
    mode: str = "auto",
) -> list[dict]:
    """Every rank's record of a ``dp x (world / dp)`` site run by ``site_worker.py``."""
    run_ranks(kids, WORKER, world, lambda port: [world, dp, mode, port, task, out, exchange])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def run_ranks(
    kids: Children, worker: Path, world: int, args: Callable[[int], list], tag: str = "rank"
) -> None:
    """``python WORKER RANK *args(store port)`` for every rank, on a store this process
    serves; each must exit 0."""
    store = dist.TCPStore(STORE_HOST, 0, is_master=True, wait_for_workers=False)
    for rank in range(world):
        argv = [sys.executable, worker, rank, *args(store.port)]
        kids.start(f"{tag}{rank}", [str(a) for a in argv])
    for rank in range(world):
        code = kids.procs[f"{tag}{rank}"].wait(timeout=120)
        assert code == 0, f"rank {rank} exited {code}:\n{kids.log(f'{tag}{rank}')[-3000:]}"


@pytest.fixture(scope="module")
def mlp_site(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The worked example task on two ranks, run once for the tests that read it."""
    out = tmp_path_factory.mktemp("mlp")
    kids = Children(out / "logs")
    try:
        return run_site(kids, "skyfed.tasks.examples:mlp_task", out)
    finally:
        kids.stop_all()


def check_matches_tp1(lead: dict) -> None:
    assert lead["digest_before"], "a sharded model must hash like the unsharded one"
    assert lead["max_delta_diff"] < 1e-4, lead["max_delta_diff"]  # Adam steps are ~3e-3
    assert set(lead["payloads_per_tensor"]) == {1, 2}, "sharded tensors arrive in 2 pieces"
    assert lead["digest_after"], "applying one update must keep the site bit-identical"


def test_tp2_site_sends_shards_that_add_up_to_the_tp1_pseudo_gradient(mlp_site):
    check_matches_tp1(mlp_site[0])


def test_default_task_under_tp_with_a_multi_tensor_optimizer(reaped, tmp_path):
    """chargpt with AdamW(foreach=True), as CUDA runs it: DTensors and plain tensors must
    not meet in one foreach kernel."""
    lead, _ = run_site(reaped, "__main__:chargpt_foreach", tmp_path)
    check_matches_tp1(lead)


def test_tp2_gradient_exchange_sends_the_tp1_momentum_step(reaped, tmp_path):
    """chargpt's sharded and replicated gradients go into the velocity slice by slice;
    relative to each tensor's step, since some steps are near 1e-5."""
    lead, _ = run_site(reaped, "chargpt", tmp_path, exchange="gradient")
    check_matches_tp1(lead)
    assert lead["max_delta_rel_diff"] < 1e-3, lead["max_delta_rel_diff"]


def test_each_rank_keeps_error_feedback_only_for_the_slices_it_owns(mlp_site):
    lead, follower = mlp_site
    assert lead["residual_keys"] == [
        "fc1.bias[0:64@0]",
        "fc1.weight[0:64@0]",
        "fc2.bias",
        "fc2.weight[0:64@1]",
    ]
    assert follower["residual_keys"] == [
        "fc1.bias[64:128@0]",
        "fc1.weight[64:128@0]",
        "fc2.weight[64:128@1]",
    ]

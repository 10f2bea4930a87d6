"""A site's residuals survive a restart with another layout: kept in logical coordinates,
cut into the new layout's slices, and kept again bit for bit (real Gloo ranks)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import torch

from skyfed.agent import state
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalTrainer
from skyfed.fingerprint import spec_digest
from skyfed.tasks import load_task

from .test_tp_ranks import run_ranks

pytestmark = pytest.mark.multiprocess

TASK = "skyfed.tasks.examples:mlp_task"
WORKER = Path(__file__).with_name("reshard_worker.py")


def one_rank_site(state_dir: Path) -> Site:
    trainer = LocalTrainer(load_task(TASK), seed=0, shard=0, num_shards=1, local_steps=2)
    return Site(trainer, state_dir=state_dir)


def kept_by_a_1x1_site(state_dir: Path) -> dict[str, torch.Tensor]:
    """Two rounds of Top-k from one rank: residuals in every tensor, kept after round 1."""
    site = one_rank_site(state_dir)
    for round in range(2):
        site.train()
        site.contribution(round, "topk")
        site.acked(round)
    site.persist(1)
    kept = state.load(state_dir, site.spec)
    assert kept is not None and kept.round == 1
    assert all(float(r.abs().sum()) > 0 for r in kept.residuals.values())
    return kept.residuals


def reshard(kids, tmp_path: Path, state_in: Path, world: int, dp: int, mode: str) -> Path:
    out = tmp_path / f"out-{dp}x{world // dp}-{mode}"
    out.mkdir()
    run_ranks(kids, WORKER, world, lambda port: [world, dp, mode, port, TASK, state_in, out])
    return out


@pytest.mark.parametrize(("world", "dp", "mode"), [(4, 2, "fsdp"), (2, 2, "ddp")])
def test_residuals_kept_by_a_1x1_site_come_back_whole_from_another_layout(
    reaped, tmp_path, world, dp, mode
):
    residuals = kept_by_a_1x1_site(tmp_path / "one")
    out = reshard(reaped, tmp_path, tmp_path / "one", world, dp, mode)
    spec = one_rank_site(tmp_path / "unused").spec
    again = state.load(out, spec)
    assert again is not None and again.round == 7
    assert again.residuals.keys() == residuals.keys()
    for name, residual in residuals.items():
        assert torch.equal(again.residuals[name], residual), name
    keys = [(out / f"rank{r}.keys").read_text().split() for r in range(world)]
    assert sum(len(k) for k in keys) >= len(residuals), "every slice went to its owner"
    if mode == "fsdp":
        assert "fc1.weight[96:128@0]" in keys[3], keys[3]


def test_the_state_file_is_private_and_another_models_is_ignored(tmp_path, caplog):
    kept_by_a_1x1_site(tmp_path)
    path = tmp_path / state.STATE_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    other = LocalTrainer(
        load_task(TASK, d_hidden=64), seed=0, shard=0, num_shards=1, local_steps=1
    ).spec
    assert spec_digest(other) != spec_digest(one_rank_site(tmp_path / "x").spec)
    assert state.load(tmp_path, other) is None
    assert "belongs to another model" in caplog.text

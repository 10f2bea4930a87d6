"""One rank of a dp x tp site, checked against a 1 x 1 replica (test_tp_ranks,
test_site_layouts).

``python site_worker.py RANK WORLD DP DP_MODE STORE_PORT TASK OUT_DIR EXCHANGE`` (DP_MODE
``hsdp:N``: HSDP with shard groups of N replicas): rank 0
drives the site and a single-process replica through the same steps and writes what it saw
to OUT_DIR. EXCHANGE is what the coordinator's welcome would set (``delta`` or
``gradient``). Every rank writes its residual keys and its slices' logical coordinates.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from skyfed.agent.ranks import STORE_HOST, init_ranks
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalTrainer
from skyfed.compression import make_codec
from skyfed.coordinator.aggregate import RoundAggregate
from skyfed.procs import exit_rank
from skyfed.tasks import load_task
from skyfed.wire import Payload


def logical_mean(site: Site, payloads: list[Payload]) -> list[torch.Tensor]:
    """What the coordinator makes of one contribution (coverage checked on the way)."""
    contribution = (aggregate := RoundAggregate(site.spec)).begin(1)
    for p in payloads:
        contribution.stage(contribution.check(p))
    contribution.commit()
    return aggregate.mean()


ROUNDS = 2  # the second carries optimizer state (Adam's moments, the velocity) along


def lead(site: Site, replica: Site) -> dict:
    seen: dict = {"digest_before": site.digest() == replica.digest()}
    seen["max_delta_diff"] = seen["max_delta_rel_diff"] = 0.0
    fp32 = make_codec("fp32")
    for round in range(ROUNDS):
        site.train(), replica.train()
        payloads = site.contribution(round, "fp32")
        ours = logical_mean(site, payloads)
        theirs = logical_mean(replica, replica.contribution(round, "fp32"))
        for a, b in zip(ours, theirs, strict=True):
            diff = float((a - b).abs().max())
            seen["max_delta_diff"] = max(seen["max_delta_diff"], diff)
            # Against the tensor's own step; floored, as attention's key bias has a zero
            # gradient (softmax ignores it) that float noise puts at 1e-13.
            rel = diff / max(float(b.abs().max()), 1e-8)
            seen["max_delta_rel_diff"] = max(seen["max_delta_rel_diff"], rel)
        seen["payloads_per_tensor"] = [
            sum(p.tensor == i for p in payloads) for i in range(len(ours))
        ]
        datas = [fp32.encode(u) for u in theirs]
        site.apply(round, datas), replica.apply(round, datas)
    seen["digest_after"] = site.digest() == replica.digest()
    return seen


def trainer(task_spec: str, exchange: str, **options: Any) -> LocalTrainer:
    local = {"seed": 0, "shard": 0, "num_shards": 1, "local_steps": 2}
    made = LocalTrainer(load_task(task_spec), **local, **options)
    made.set_exchange(exchange, lr=0.1, momentum=0.9)
    return made


def main(
    rank: int, world: int, dp: int, mode: str, port: int, task_spec: str, out: Path, exchange: str
) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore(STORE_HOST, port, is_master=False)
    mode, _, shard = mode.partition(":")  # hsdp:2: HSDP shard groups of 2 replicas
    group, mesh, device = init_ranks(rank, world, "cpu", store, dp=dp, dp_shard=int(shard or 0))
    made = trainer(task_spec, exchange, mesh=mesh, device=device, dp_mode=mode)
    site = Site(made, group)
    seen: dict = {}
    if rank == 0:
        seen = lead(site, Site(trainer(task_spec, exchange)))
        site.stop()
    else:
        site.follow()
    seen["residual_keys"] = sorted(site.uplink.feedback.residuals)
    seen["dp_mode"] = made.dp_mode
    seen["owned"] = [
        [info.name, shard]
        for info, shard, own in zip(made.spec, made.shards, made.owned, strict=True)
        if own
    ]
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


def chargpt_foreach() -> object:
    """The default task with the multi-tensor (foreach) optimizer CUDA picks by default."""
    from skyfed.tasks.chargpt import CharTask

    task = CharTask()
    task.make_optimizer = lambda params: torch.optim.AdamW(params, lr=3e-3, foreach=True)
    return task


if __name__ == "__main__":
    rank, world, dp, mode, port, task_spec, out, exchange = sys.argv[1:9]
    main(int(rank), int(world), int(dp), mode, int(port), task_spec, Path(out), exchange)
    exit_rank(0)  # as the agent's ranks do: teardown may abort in torch's destructors

"""One rank of a dp x tp site that takes the residuals a state directory kept and keeps
them again (test_site_state): ``python reshard_worker.py RANK WORLD DP MODE PORT TASK IN OUT``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from skyfed.agent.ranks import STORE_HOST, init_ranks
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalTrainer
from skyfed.procs import exit_rank
from skyfed.tasks import load_task


def main(argv: list[str]) -> None:
    rank, world, dp, mode, port, task, state_in, state_out = argv
    torch.set_num_threads(1)
    store = dist.TCPStore(STORE_HOST, int(port), is_master=False)
    group, mesh, device = init_ranks(int(rank), int(world), "cpu", store, dp=int(dp))
    trainer = LocalTrainer(
        load_task(task), seed=0, shard=0, num_shards=1, local_steps=1,
        mesh=mesh, device=device, dp_mode=mode,
    )  # fmt: skip
    site = Site(trainer, group, state_dir=Path(state_in))
    if group.rank == 0:
        site.restore()
        site.state_dir = Path(state_out)
        site.persist(7)
        site.stop()
    else:
        site.follow()
    Path(state_out, f"rank{rank}.keys").write_text(
        "\n".join(sorted(site.uplink.feedback.residuals))
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:9])
    exit_rank(0)

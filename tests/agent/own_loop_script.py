"""A training script a user already has (a plain PyTorch loop over their own MLP, data and
optimizer), with ``skyfed.Site`` added: the tests run it as a site of a federation.

    python tests/agent/own_loop_script.py --cloud aws --coordinator localhost:7443 \\
        --certs certs --local-steps 2 --report aws.json
    torchrun --nproc-per-node 2 tests/agent/own_loop_script.py --layout ddp ...

The model is ``skyfed.tasks.examples:mlp_task``'s architecture, written out here as a
user's own, so a coordinator serving that task builds the same fingerprint.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import skyfed


class Classifier(nn.Module):
    def __init__(self, d_in: int = 32, d_hidden: int = 128, n_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))  # (B, n_classes)


def batches(seed: int, batch: int = 32):
    """Points labelled by a fixed teacher (the task's world), this site's own stream."""
    teacher = torch.randn(32, 10, generator=torch.Generator().manual_seed(1234))
    gen = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(batch, 32, generator=gen)  # (B, 32)
        yield x, torch.tanh(x).matmul(teacher).argmax(dim=1)


def accuracy(model: nn.Module) -> float:
    with torch.no_grad():
        x, y = next(batches(seed=999, batch=256))
        return float((model(x).argmax(dim=1) == y).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cloud", required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--certs", required=True)
    parser.add_argument("--local-steps", type=int, default=2)
    parser.add_argument("--report", type=Path)
    parser.add_argument("--state-dir", type=Path)
    parser.add_argument("--layout", choices=("one", "ddp", "fsdp", "tp"), default="one")
    parser.add_argument("--max-steps", type=int, default=10_000)
    parser.add_argument("--out", type=Path, help="write the final weights' digest and steps here")
    args = parser.parse_args()

    torch.manual_seed(7)  # the user's own initialisation: the federation's weights replace it
    model: nn.Module = Classifier()
    mesh = None
    rank = 0
    if args.layout != "one":
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    if args.layout == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    if args.layout == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)  # over every rank: each holds a slice of every parameter
    if args.layout == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh = init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    site = skyfed.Site(
        model,
        optimizer,
        cloud=args.cloud,
        coordinator=args.coordinator,
        certs=args.certs,
        local_steps=args.local_steps,
        mesh=mesh,
        samples_per_step=32,
        report=args.report,
        state_dir=args.state_dir,
        reconnect_max_s=0.5,
    )
    steps = 0
    with site:
        # A DDP or TP replica trains on its own stream (the TP ranks of one replica share it).
        replica = rank if args.layout in ("ddp", "fsdp") else 0
        data = batches(seed=sum(args.cloud.encode()) + replica)
        for x, y in data:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            if steps % (2 * args.local_steps) == 0 and args.layout != "tp":
                site.report({"accuracy": accuracy(model), "steps": steps})
            if not site.step(loss) or steps >= args.max_steps:
                break
    # The weights as the script holds them now (a TP shard's gather is every rank's call).
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    if args.out is not None and rank == 0:
        from skyfed.fingerprint import weights_digest

        out = {"digest": weights_digest(t.detach() for t in full), "steps": steps}
        args.out.write_text(json.dumps({**out, "finished": site.finished}))
    if args.layout != "one":
        dist.destroy_process_group()
        skyfed.exit_rank(0)  # torch's teardown after a multi-process run may abort (SIGABRT)


if __name__ == "__main__":
    main()

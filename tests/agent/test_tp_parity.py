"""A site with tp=2 and a site with tp=1 train one model, the same as two tp=1 sites."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from skyfed.coordinator.server import Running
from skyfed.procs import Children, command

pytestmark = pytest.mark.multiprocess

ROUNDS = 3


def start_agent(
    kids: Children, certs: Path, port: int, cloud: str, shard: int, *, tp: int, tag: str
) -> None:
    flags = {
        "--cloud": cloud,
        "--coordinator": f"localhost:{port}",
        "--certs": certs,
        "--shard": shard,
        "--num-shards": 2,
        "--local-steps": 2,
        "--tp": tp,
        "--device": "cpu",
    }
    argv = command("agent", "start", *(str(x) for kv in flags.items() for x in kv))
    kids.start(f"{tag}-{cloud}", argv)


def train(
    serve: Callable[..., Running], kids: Children, certs: Path, tps: dict[str, int], tag: str
) -> list[torch.Tensor]:
    """Final weights of a federation whose sites run with the given ``tp``."""
    running = serve(min_agents=len(tps), quorum=len(tps), rounds=ROUNDS, codec="fp32")
    for shard, (cloud, tp) in enumerate(tps.items()):
        start_agent(kids, certs, running.port, cloud, shard, tp=tp, tag=tag)
    for cloud in tps:
        code = kids.procs[f"{tag}-{cloud}"].wait(timeout=180)
        assert code == 0, f"{cloud} exited {code}:\n{kids.log(f'{tag}-{cloud}')[-3000:]}"
    deadline = time.monotonic() + 10
    while not running.federation.finished:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return [w.clone() for w in running.federation.weights]


def test_tp2_site_and_tp1_site_train_the_same_model_as_two_tp1_sites(serve, reaped, pki):
    reference = train(serve, reaped, pki.directory, {"aws": 1, "gcp": 1}, "ref")
    mixed = train(serve, reaped, pki.directory, {"aws": 2, "gcp": 1}, "tp")
    for ref, got in zip(reference, mixed, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    assert "[Agent.Ranks] dp=1 tp=2" in reaped.log("tp-aws")

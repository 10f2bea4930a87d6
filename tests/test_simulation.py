"""The in-process simulation runs the federation's own round: same inputs, same bits.

A real coordinator (gRPC over mTLS) and three ``agent start`` processes train a few
rounds; the simulation of the same configuration ends with the same weights, bit for bit,
under every codec, with norm clipping engaged and DiLoCo's outer Nesterov step on.
"""

from __future__ import annotations

import logging
import time

import pytest
import torch

from skyfed.coordinator.federation import round_rules
from skyfed.coordinator.model import RoundRules
from skyfed.procs import command
from skyfed.simulate import SimulatedSite, Simulation

pytestmark = pytest.mark.multiprocess

TASK = "chargpt?n_layer=1&d_model=32&n_head=2&block=32&batch=8&eval_batches=2"
CLOUDS = ("aws", "gcp", "azure")
ROUNDS = 3
LOCAL_STEPS = 2


@pytest.fixture(autouse=True)
def one_thread():
    """The agents train on one thread each: so does the simulation (a second intra-op
    thread can change a float sum's order)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("codec", "overlap"),
    [("fp32", False), ("fp16", False), ("topk", False), ("ecsgd", False), ("topk", True)],
)
def test_a_simulated_round_gives_the_federations_bits(serve, reaped, pki, codec, overlap):
    running = serve(
        task=TASK,
        codec=codec,
        min_agents=3,
        quorum=3,
        rounds=ROUNDS,
        clip_norm_ratio=1.0,  # the median's bound: clips one site of three every round
        outer_optimizer="nesterov",
        overlap=overlap,
        final_wait_s=10,
    )
    for cloud in CLOUDS:
        flags = {
            "--cloud": cloud,
            "--coordinator": f"localhost:{running.port}",
            "--certs": pki.directory,
            "--task": TASK,
            "--local-steps": LOCAL_STEPS,
        }
        reaped.start(cloud, command("agent", "start", *(str(x) for f in flags.items() for x in f)))
    deadline = time.monotonic() + 180
    while not running.federation.rounds.finished:
        assert time.monotonic() < deadline, reaped.log("aws")[-2000:]
        time.sleep(0.1)
    for cloud in CLOUDS:
        assert reaped.procs[cloud].wait(timeout=60) == 0, reaped.log(cloud)[-2000:]
    assert [r.contributors for r in running.federation.rounds.history] == [3] * ROUNDS

    sim = Simulation(
        TASK,
        [SimulatedSite(cloud=c, local_steps=LOCAL_STEPS, codec=codec) for c in CLOUDS],
        round_rules(running.federation.config),
        overlap=overlap,
    )
    for _ in range(ROUNDS):
        sim.round()
    sim.finish()
    assert sim.model.weights_digest == running.federation.model.weights_digest
    assert set(sim.digests()) == {sim.model.weights_digest}
    for got, want in zip(sim.model.weights, running.federation.model.weights, strict=True):
        assert torch.equal(got, want)


def test_clipping_engages_in_the_simulation(caplog):
    """The bound the equality test runs under does scale updates (else that test would
    not pin clipping): at ratio 1, the site above the median of three is clipped."""
    sites = [SimulatedSite(cloud=c, local_steps=LOCAL_STEPS) for c in CLOUDS]
    sim = Simulation(TASK, sites, RoundRules(clip_norm_ratio=1.0))
    with caplog.at_level(logging.WARNING, logger="skyfed.coordinator.robust"):
        sim.round()
    assert sum("[Coordinator.Clip]" in r.message for r in caplog.records) == 1

"""The outer step's defaults converge on a short run of each task and of the Llama example,
on the far-link recipe (long local phases, EC-SGD as the policy gives them) and with
overlap, through the product's own round (``skyfed/simulate.py``) under the rules a
coordinator's default configuration sets. What they cost against data-parallel is the bench's
(``bench/convergence.py --to-target``); here only that the held-out loss falls."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.federation import round_rules
from skyfed.simulate import Simulation, sharded

CHARGPT = "chargpt?n_layer=1&d_model=32&n_head=2&block=32&batch=8&eval_batches=4"
DIGITS = "skyfed.tasks.examples:digits"
LLAMA = "skyfed.tasks.llama:llama"
"""The config-built Hugging Face Llama example (docs/bring-your-own-model.md)."""
MARGIN = 0.4
"""The held-out loss after the run is at least this fraction below its start."""


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def config(**options: object) -> CoordinatorConfig:
    """A coordinator's configuration at its defaults (no certificates are read here)."""
    paths = {"ca": Path("ca.crt"), "cert": Path("c.crt"), "key": Path("c.key")}
    return CoordinatorConfig.from_flat(**paths, **options)


@pytest.mark.parametrize(
    ("task", "local_steps", "rounds"),
    [(CHARGPT, 64, 3), (DIGITS, 128, 3), (LLAMA, 64, 3)],
    ids=["chargpt", "digits", "llama"],
)
@pytest.mark.parametrize("overlap", [False, True], ids=["fedavg", "overlap"])
def test_the_outer_defaults_converge_on_the_far_link_recipe(task, local_steps, rounds, overlap):
    coordinator = config(overlap=overlap)
    sites = sharded(3, local_steps=local_steps, codec="ecsgd")
    sim = Simulation(task, sites, round_rules(coordinator), overlap=overlap)
    start = sim.evaluate()
    for _ in range(rounds):
        sim.round()
    assert sim.evaluate() < (1 - MARGIN) * start


@pytest.mark.parametrize("overlap", [False, True], ids=["fedavg", "overlap"])
def test_the_outer_defaults_converge_at_the_agents_default_local_steps(overlap):
    """4 local steps (the agent's default) on a medium link's Top-k: a slower fall."""
    coordinator = config(overlap=overlap)
    sites = sharded(3, local_steps=4, codec="topk")
    sim = Simulation(CHARGPT, sites, round_rules(coordinator), overlap=overlap)
    start = sim.evaluate()
    for _ in range(8):
        sim.round()
    assert sim.evaluate() < (1 - MARGIN / 2) * start

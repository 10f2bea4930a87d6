"""The coordinator's outer step: FedAvg by default, DiLoCo's Nesterov momentum on request."""

from __future__ import annotations

import pytest
import torch

from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.outer import OuterOptimizer, OuterSettings
from skyfed.coordinator.server import run_server

from ..conftest import RawAgent, credentials  # noqa: TID252 - shared helpers
from .test_bad_input import contribution, deltas, join, send


def rounds_of_means(n: int = 6, seed: int = 0) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(5, 3, generator=gen), torch.randn(7, generator=gen)] for _ in range(n)]


@pytest.mark.parametrize(("kind", "nesterov"), [("nesterov", True), ("sgd", False)])
def test_outer_steps_equal_torch_sgd_on_the_mean_pseudo_gradient(kind, nesterov):
    settings = OuterSettings.resolve(kind, 0.7, 0.9)
    outer = OuterOptimizer(settings)
    ours = [torch.zeros(5, 3), torch.zeros(7)]
    params = [torch.nn.Parameter(torch.zeros(5, 3)), torch.nn.Parameter(torch.zeros(7))]
    reference = torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=nesterov)
    for mean in rounds_of_means():
        for w, step in zip(ours, outer.step(mean), strict=True):
            w.sub_(step)
        for p, g in zip(params, mean, strict=True):
            p.grad = g.clone()
        reference.step()
        for w, p in zip(ours, params, strict=True):
            torch.testing.assert_close(w, p.detach(), rtol=1e-6, atol=1e-6)


def test_default_outer_step_is_federated_averaging_bit_for_bit():
    outer = OuterOptimizer(OuterSettings.resolve("sgd", None, None))
    mean = rounds_of_means(1)[0]
    assert all(s is g for s, g in zip(outer.step(mean), mean, strict=True))
    assert outer.state() is None


def test_nesterov_defaults_are_dilocos():
    assert OuterSettings.resolve("nesterov", None, None) == OuterSettings("nesterov", 0.7, 0.9)


def test_overlap_halves_an_unset_outer_rate_and_keeps_a_set_one():
    assert OuterSettings.resolve("sgd", None, None, overlap=True) == OuterSettings("sgd", 0.5)
    halved = OuterSettings.resolve("nesterov", None, None, overlap=True)
    assert (halved.lr, halved.momentum) == (0.35, 0.9)
    assert OuterSettings.resolve("sgd", 1.0, None, overlap=True).lr == 1.0  # set: as set


def test_restored_momentum_resumes_the_same_trajectory():
    means = rounds_of_means(6)
    straight = OuterOptimizer(OuterSettings.resolve("nesterov", None, None))
    steps = [straight.step(m) for m in means]
    first = OuterOptimizer(OuterSettings.resolve("nesterov", None, None))
    for m in means[:3]:
        first.step(m)
    saved = [b.clone() for b in first.state() or []]
    resumed = OuterOptimizer(OuterSettings.resolve("nesterov", None, None))
    resumed.load(saved)
    for m, expected in zip(means[3:], steps[3:], strict=True):
        for got, want in zip(resumed.step(m), expected, strict=True):
            assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("kind", "lr", "momentum", "named"),
    [
        ("adam", None, None, "outer_optimizer"),
        ("sgd", 0.0, None, "outer_lr"),
        ("nesterov", None, 0.0, "outer_momentum"),
        ("sgd", None, 1.0, "outer_momentum"),
    ],
)
def test_a_bad_outer_option_names_itself(kind, lr, momentum, named):
    with pytest.raises(ValueError, match=named):
        OuterSettings.resolve(kind, lr, momentum)


def rounds_through_a_coordinator(pki, ckpt, first: int, count: int) -> list[torch.Tensor]:
    """Serve a Nesterov federation (real mTLS gRPC, checkpoints in ``ckpt``) for rounds
    ``first .. first + count - 1`` of one agent's fixed contributions; its final weights."""
    config = CoordinatorConfig.from_flat(
        listen="127.0.0.1:0",
        certs=pki.directory,
        codec="fp32",
        outer_optimizer="nesterov",
        checkpoint_dir=ckpt,
    )
    with run_server(config) as running:
        agent = RawAgent(running.port, credentials(pki.directory, "aws-1"))
        try:
            join(agent, "aws", "aws-1")
            for r in range(first, first + count):
                send(agent, *contribution(deltas(r), round=r))
                skip = ("heartbeat", "chunk", "weights_end", "receipt")
                assert agent.expect("round_end", skip=skip).round_end.round == r
        finally:
            agent.close()
        return [w.clone() for w in running.federation.model.weights]


def test_the_outer_momentum_survives_a_coordinator_restart(pki, tmp_path):
    straight = rounds_through_a_coordinator(pki, tmp_path / "straight", 0, 6)
    rounds_through_a_coordinator(pki, tmp_path / "restarted", 0, 3)
    resumed = rounds_through_a_coordinator(pki, tmp_path / "restarted", 3, 3)
    for a, b in zip(straight, resumed, strict=True):
        assert torch.equal(a, b)

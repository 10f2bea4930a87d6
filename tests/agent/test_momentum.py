"""DGC's momentum correction: the step a site sends in gradient exchange."""

from __future__ import annotations

import pytest
import torch

from skyfed.agent.momentum import MomentumCorrection
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalTrainer
from skyfed.compression import ErrorFeedback, decode_payload, make_codec
from skyfed.tasks import load_task


def test_uncompressed_gradient_exchange_is_momentum_sgd():
    torch.manual_seed(0)
    w_sgd = torch.randn(50, requires_grad=True)
    w_ours = w_sgd.detach().clone()
    sgd = torch.optim.SGD([w_sgd], lr=0.1, momentum=0.9)
    ours = MomentumCorrection(lr=0.1, momentum=0.9)
    for _ in range(20):
        g = torch.randn(50)
        w_sgd.grad = g.clone()
        sgd.step()
        (step,) = ours.step([g])
        w_ours -= step
    torch.testing.assert_close(w_ours, w_sgd.detach())


def test_coordinates_topk_sent_restart_their_velocity():
    ours = MomentumCorrection(lr=0.5, momentum=0.9)
    topk = make_codec("topk", density=0.5, dense_below=1)
    (step,) = ours.step([torch.tensor([4.0, -3.0, 0.5, 0.1])])
    ((_, payload),) = ErrorFeedback().encode(topk, [("w", step)])
    sent = decode_payload(payload, shape=step.shape)
    ours.mask([sent], topk)
    assert sent[:2].ne(0).all() and sent[2:].eq(0).all()
    torch.testing.assert_close(ours.velocity[0], torch.tensor([0.0, 0.0, 0.5, 0.1]))


def test_tensors_a_rank_does_not_send_stay_none():
    ours = MomentumCorrection(lr=0.1, momentum=0.9)
    steps = ours.step([torch.ones(3), None])
    assert steps[1] is None
    ours.mask([torch.ones(3), None], make_codec("topk", density=0.5, dense_below=1))
    assert ours.velocity[1] is None


@pytest.mark.parametrize(("lr", "momentum"), [(0.0, 0.9), (0.1, 1.0), (0.1, -0.1)])
def test_rate_or_momentum_out_of_range_is_refused(lr, momentum):
    with pytest.raises(ValueError, match="must be"):
        MomentumCorrection(lr, momentum)


def mlp_trainer() -> LocalTrainer:
    task = load_task("skyfed.tasks.examples:mlp_task")
    return LocalTrainer(task, seed=0, shard=0, num_shards=1, local_steps=2)


def test_gradient_exchange_leaves_the_weights_and_sends_the_sgd_step():
    trainer = mlp_trainer()
    before = trainer.digest()
    trainer.set_exchange("gradient", lr=0.5, momentum=0.9)
    result = trainer.train()
    assert trainer.digest() == before, "the weights move only when the aggregate comes"
    # The same model and batches by hand: the first step is lr times the mean gradient.
    task = load_task("skyfed.tasks.examples:mlp_task")
    model, batches = task.build_model(0), task.batches(0, 1, 0)
    loss = (task.loss(model, next(batches)) + task.loss(model, next(batches))) / 2
    loss.backward()
    for step, p in zip(result.delta, model.parameters(), strict=True):
        torch.testing.assert_close(step, 0.5 * p.grad)
    assert result.samples == 2 * task.batch_size()


@pytest.mark.parametrize("codec", ['topk:{"density": 0.05}', "fp16"])
def test_topk_restarts_the_velocity_of_what_it_sent_and_dense_codecs_keep_it(codec):
    site = Site(mlp_trainer())
    site.set_exchange("gradient", 0.1, 0.9)
    site.train()
    site.contribution(0, codec)
    velocity, sent_all = site.trainer.momentum.velocity, site.uplink.sent(0)
    assert {s.numel() >= 1024 for s in sent_all} == {True, False}, "both kinds of tensor"
    for info, u, sent in zip(site.spec, velocity, sent_all, strict=True):
        went = sent != 0
        if codec == "fp16":
            assert went.all() and u.ne(0).any(), info.name
        elif sent.numel() >= 1024:  # sent sparsely: what went restarts, the rest goes on
            assert 0 < int(went.sum()) < sent.numel(), info.name
            assert u[went].eq(0).all() and u[~went].ne(0).any(), info.name
        else:  # biases go whole, and restart too (docs/decisions/momentum-of-whole-tensors.md)
            assert went.float().mean() > 0.5 and u[went].eq(0).all(), info.name


def test_velocity_is_kept_only_while_the_settings_stay_the_same():
    trainer = mlp_trainer()
    trainer.set_exchange("gradient", lr=0.1, momentum=0.9)
    trainer.train()
    kept = trainer.momentum
    trainer.set_exchange("gradient", lr=0.1, momentum=0.9)
    assert trainer.momentum is kept
    trainer.set_exchange("gradient", lr=0.2, momentum=0.9)
    assert trainer.momentum is not kept and not trainer.momentum.velocity
    trainer.set_exchange("delta", lr=0.2, momentum=0.9)
    assert trainer.momentum is None

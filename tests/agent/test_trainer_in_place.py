"""The trainer's round without model-sized temporaries: the same bits as before."""

from __future__ import annotations

import pytest
import torch

from skyfed.agent.trainer import LocalTrainer
from skyfed.compression import codec_names, make_codec
from skyfed.fingerprint import weights_digest
from skyfed.tasks import load_task

TASK = "skyfed.tasks.examples:wide?params=20k&batch=4"


def _trainer(local_steps: int = 2) -> LocalTrainer:
    return LocalTrainer(load_task(TASK), seed=0, shard=0, num_shards=1, local_steps=local_steps)


def test_training_restores_the_weights_and_returns_start_minus_end():
    trainer = _trainer()
    start = [p.detach().clone() for p in trainer.params]
    twin = _trainer()  # the same seed and data: the end weights by plain training
    for _ in range(twin.local_steps):
        loss = twin.task.loss(twin.model, next(twin.batches))
        twin.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        twin.optimizer.step()
    result = trainer.train()
    for p, s, d, end in zip(trainer.params, start, result.delta, twin.params, strict=True):
        assert torch.equal(p, s)  # the weights are back where the round started
        assert torch.equal(d, s - end.detach())
    assert all(p.grad is None for p in trainer.params)  # no gradients held into the exchange


@pytest.mark.parametrize("name", codec_names())
def test_applying_payloads_in_place_is_bit_for_bit_applying_their_decoding(name):
    codec = make_codec(name, seed=[4])
    a, b = _trainer(), _trainer()
    gen = torch.Generator().manual_seed(2)
    datas = [bytes(codec.encode(torch.randn(p.shape, generator=gen) * 1e-2)) for p in a.params]
    decoded = [codec.decode(d, shape=tuple(p.shape)) for d, p in zip(datas, a.params, strict=True)]
    a.apply(decoded)
    b.apply_encoded(datas)
    assert a.digest() == b.digest()
    loaded = _trainer()
    loaded.load_encoded([bytes(make_codec("fp32").encode(p.detach())) for p in a.params])
    assert loaded.digest() == a.digest()


def _payloads(trainer: LocalTrainer, seed: int = 2) -> list[bytes]:
    codec = make_codec("topk", seed=[4])
    gen = torch.Generator().manual_seed(seed)
    return [bytes(codec.encode(torch.randn(p.shape, generator=gen) * 1e-2)) for p in trainer.params]


def test_payloads_applied_as_they_arrive_in_any_order_are_the_whole_apply():
    a, b = _trainer(), _trainer()
    datas = _payloads(a)
    a.apply_encoded(datas)
    b.start_apply()
    for i in reversed(range(len(datas))):  # the last tensor's payload first
        assert b.applying
        b.apply_payload(i, datas[i])
    b.finish_apply()
    assert not b.applying
    assert b.digest() == a.digest()
    assert b.digest() == _trainer_digest_from_scratch(b)


def test_finishing_an_apply_with_a_tensor_missing_is_refused():
    trainer = _trainer()
    datas = _payloads(trainer)
    trainer.start_apply()
    trainer.apply_payload(0, datas[0])
    with pytest.raises(RuntimeError, match="before every tensor"):
        trainer.finish_apply()


def test_the_digest_begun_by_an_apply_survives_the_local_steps_that_follow():
    """The daemon checks the last aggregate's digest after the next local steps
    (docs/wan.md): training puts the weights back, and the digest it finished during the
    first step is theirs."""
    trainer = _trainer(local_steps=3)
    trainer.apply_encoded(_payloads(trainer))
    expected = _trainer_digest_from_scratch(trainer)
    trainer.train()
    assert trainer.digest() == expected
    trainer.apply_encoded(_payloads(trainer, seed=3))  # the weights change: a new digest
    assert trainer.digest() != expected
    assert trainer.digest() == _trainer_digest_from_scratch(trainer)


def _trainer_digest_from_scratch(trainer: LocalTrainer) -> str:
    return weights_digest(p.detach() for p in trainer.params)

"""Peak memory of a round over the model's float32 bytes, both ends, measured in one run.

The kernel's peak RSS (``VmHWM``) is reset to the current RSS before each phase
(``/proc/self/clear_refs``), so each figure is what the phase added at its peak; ratios,
not absolute limits (docs/scale.md has the bench's whole-process figures).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalTrainer
from skyfed.compression import make_codec
from skyfed.compression.policy import PolicyConfig
from skyfed.coordinator.aggregate import RoundAggregate
from skyfed.coordinator.downlink import Downlink
from skyfed.fingerprint import model_spec
from skyfed.tasks import load_task
from skyfed.wire import Payload

TASK = "skyfed.tasks.examples:wide?params=16M&batch=2"
AGENTS = 8


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


def _reset_peak() -> int:
    Path("/proc/self/clear_refs").write_text("5")
    return _rss("VmRSS:")


def _added_peak(since: int) -> int:
    return _rss("VmHWM:") - since


@pytest.fixture(scope="module")
def model():
    return load_task(TASK).build_model(0)


@pytest.mark.parametrize("codec", ["fp16", "topk"])
def test_a_coordinator_round_with_eight_agents_stays_within_its_budget(model, codec):
    named = list(model.named_parameters())
    spec = model_spec(named)
    model_bytes = sum(t.numel for t in spec) * 4
    weights = [p.detach().clone() for _, p in named]
    downlink = Downlink(spec, PolicyConfig(), 0)
    gen = torch.Generator().manual_seed(0)
    uplinks = []
    for a in range(AGENTS):
        up = make_codec(codec, seed=[a])
        uplinks.append([bytes(up.encode(torch.randn(t.shape, generator=gen) * 1e-3)) for t in spec])
    staged = sum(len(d) for per_agent in uplinks for d in per_agent)
    start = _reset_peak()
    aggregate = RoundAggregate(spec)
    for a, datas in enumerate(uplinks):
        c = aggregate.begin(4, f"agent-{a}")
        for i, data in enumerate(datas):
            p = Payload(i, None, codec, data)
            c.stage(c.check(p))
        c.commit()
    del uplinks  # the aggregate holds the only copies now, as the coordinator does
    checked = _added_peak(start)

    def update(i: int, out: torch.Tensor) -> torch.Tensor:
        aggregate.mean_into(i, out)
        aggregate.release(i)
        return out

    start = _reset_peak()
    sent = [len(p.data) for p in downlink.encode(weights, update, codec, AGENTS, 0)]
    closed = _added_peak(start)
    # Checking decodes into two shared scratch buffers, at most a tensor each.
    assert checked - staged <= 0.6 * model_bytes, (checked / model_bytes, staged / model_bytes)
    # The close: one reused update buffer and the residual (1x, first round), payloads out.
    assert closed <= 1.5 * model_bytes, closed / model_bytes
    assert sum(sent) < model_bytes


def test_an_agent_round_holds_no_model_sized_temporaries(model):
    trainer = LocalTrainer(load_task(TASK), seed=0, shard=0, num_shards=1, local_steps=1)
    model_bytes = sum(p.numel() for p in trainer.params) * 4
    site = Site(trainer, sender="aws-1")
    peaks = []
    for round_ in range(2):  # the second round has its residuals from the first
        start = _reset_peak()
        site.train()
        payloads = site.contribution(round_, "fp16")
        site.acked(round_)
        datas = [bytes(make_codec("fp16").encode(torch.zeros(t.shape))) for t in trainer.spec]
        site.apply(round_, datas)
        peaks.append(_added_peak(start) / model_bytes)
        del payloads
    # Over the weights themselves: the round's start and the gradients (the delta takes
    # the gradients' memory), the residual, the payloads; nothing more.
    assert max(peaks) <= 3.0, peaks

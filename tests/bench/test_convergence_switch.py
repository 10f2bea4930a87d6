"""``bench/convergence.py --switch``: a codec schedule runs the codecs a link policy would."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from skyfed.compression.policy import GRADIENT_ECSGD_CLIP

BENCH = Path(__file__).resolve().parents[2] / "bench" / "convergence.py"


@pytest.fixture(scope="module")
def convergence():
    spec = importlib.util.spec_from_file_location("bench_convergence", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_switch_schedule_changes_codec_at_the_named_rounds(convergence):
    codec_at = convergence.codec_at("fp16:2,topk:3,fp16", warmup_rounds=0, gradient=True)
    names = [codec_at(t).name for t in range(8)]
    assert names == ["fp16", "fp16", "topk", "topk", "topk", "fp16", "fp16", "fp16"]
    assert codec_at(2).density == 0.01  # the policy's Top-k, not the 0.1 % table row
    one = convergence.codec_at("topk", warmup_rounds=0, gradient=True)  # no switch at all
    assert [one(t).name for t in (0, 500)] == ["topk", "topk"]


def test_a_switch_to_topk_can_warm_its_density_up_from_the_switch(convergence):
    codec_at = convergence.codec_at("fp16:3,topk~2", warmup_rounds=0, gradient=False)
    densities = [codec_at(t).density for t in (3, 4, 5, 50)]
    assert densities == pytest.approx([0.25, 0.25 * (0.05 / 0.25) ** 0.5, 0.05, 0.05])


def test_switch_schedule_uses_the_gradient_exchange_ecsgd_clip(convergence):
    gradient = convergence.codec_at("fp16:1,ecsgd", warmup_rounds=0, gradient=True)
    delta = convergence.codec_at("fp16:1,ecsgd", warmup_rounds=0, gradient=False)
    assert gradient(1).clip == GRADIENT_ECSGD_CLIP and delta(1).clip != GRADIENT_ECSGD_CLIP


@pytest.mark.parametrize(
    ("schedule", "reason"),
    [
        ("fp16,topk", "only the last codec"),
        ("fp16:0,topk", "at least one round"),
        ("zip:3", "zip"),
        ("fp16~5:3,topk", "only topk warms up"),
        ("fp16:3,topk~0", "only topk warms up"),
    ],
)
def test_a_bad_switch_schedule_is_refused_with_the_reason(convergence, schedule, reason):
    with pytest.raises(ValueError, match=reason):
        convergence.switching(schedule, gradient=True)

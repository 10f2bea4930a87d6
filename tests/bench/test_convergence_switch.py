"""``bench/convergence.py --switch``: a codec schedule runs the codecs a link policy would,
through the product's own round (each link's ``CodecRun`` and the policy's parameters)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from skyfed.compression.policy import GRADIENT_ECSGD_CLIP
from skyfed.compression.spec import parse_spec

BENCH = Path(__file__).resolve().parents[2] / "bench" / "convergence.py"


@pytest.fixture(scope="module")
def convergence():
    spec = importlib.util.spec_from_file_location("bench_convergence", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _uplinks(convergence, label: str, rounds: int, gradient: bool) -> list[tuple[str, dict]]:
    """Site 0's codec and parameters in each round, as its link told it."""
    cfg = convergence.Config(rounds, 1, 1, 0, sgd_lr=0.1 if gradient else 0.0)
    sim = convergence.simulation(label, 0, cfg)
    return [parse_spec(sim.round().codecs[0]) for _ in range(rounds)]


def test_switch_schedule_changes_codec_at_the_named_rounds(convergence):
    specs = _uplinks(convergence, "fp16:2,topk:3,fp16", 7, gradient=True)
    names = [name for name, _ in specs]
    assert names == ["fp16", "fp16", "topk", "topk", "topk", "fp16", "fp16"]
    assert specs[2][1]["density"] == 0.01  # the policy's Top-k under gradient exchange
    schedule, _ = convergence.switching("topk", gradient=True)  # no switch at all
    assert [schedule(0, t) for t in (0, 500)] == ["topk", "topk"]


def test_a_switch_to_topk_can_warm_its_density_up_from_the_switch(convergence):
    specs = _uplinks(convergence, "fp16:3,topk~2", 6, gradient=False)
    densities = [params["density"] for _, params in specs[3:]]
    assert densities == pytest.approx([0.25, 0.25 * (0.05 / 0.25) ** 0.5, 0.05])


def test_switch_schedule_uses_the_gradient_exchange_ecsgd_clip(convergence):
    _, gradient = convergence.switching("fp16:1,ecsgd", gradient=True)
    _, delta = convergence.switching("fp16:1,ecsgd", gradient=False)
    assert gradient.codec_params("ecsgd")["clip"] == GRADIENT_ECSGD_CLIP
    assert "clip" not in delta.codec_params("ecsgd")


@pytest.mark.parametrize(
    ("schedule", "reason"),
    [
        ("fp16,topk", "only the last codec"),
        ("fp16:0,topk", "at least one round"),
        ("zip:3", "zip"),
        ("fp16~5:3,topk", "only topk warms up"),
        ("fp16:3,topk~0", "only topk warms up"),
        ("topk~2:3,fp16:1,topk~5", "one warm-up per schedule"),
    ],
)
def test_a_bad_switch_schedule_is_refused_with_the_reason(convergence, schedule, reason):
    with pytest.raises(ValueError, match=reason):
        convergence.switching(schedule, gradient=True)

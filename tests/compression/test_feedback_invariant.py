"""Error feedback: what was sent plus the residual is what was fed in, over many steps."""

from __future__ import annotations

import pytest
import torch

from skyfed.compression import ErrorFeedback, decode_add_payload, decode_payload, make_codec
from skyfed.compression.feedback import release_share
from skyfed.compression.schedule import DensityWarmup


def encode(ef: ErrorFeedback, codec, g: torch.Tensor, key: str = "w") -> tuple[bytes, torch.Tensor]:
    """One tensor through ``ef``: its payload and what it sends, decoded."""
    payload = dict(ef.encode(codec, [(key, g)]))[key]
    return payload, decode_payload(payload, shape=g.shape)


LOSSY = [
    ("fp16", {}),
    ("bf16", {}),
    ("topk", {"density": 0.01}),
    ("topk", {"density": 0.05, "values": "fp16"}),
    ("topk", {"density": 0.05, "bits": 2}),
    ("topk", {"density": 0.02, "bits": 3}),
    ("topk", {"density": 0.05, "bits": 4}),
    ("ecsgd", {"bits": 1}),
    ("ecsgd", {"bits": 2, "seed": 0}),
    ("ecsgd", {"bits": 4, "seed": 0}),
]


def _run(ef: ErrorFeedback, codecs: list, steps: int, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(0)
    fed = torch.zeros(shape, dtype=torch.float64)
    sent = torch.zeros(shape, dtype=torch.float64)
    for step in range(steps):
        g = torch.randn(shape, generator=gen)
        fed += g
        payload, _ = encode(ef, codecs[step % len(codecs)], g)
        decode_add_payload(payload, sent)
        residual = ef.residuals["w"].double()
        assert torch.allclose(sent + residual, fed, atol=1e-4 * (step + 1) ** 0.5)


@pytest.mark.parametrize(("name", "params"), LOSSY)
def test_sent_plus_residual_equals_fed_over_many_steps(name: str, params: dict) -> None:
    _run(ErrorFeedback(), [make_codec(name, **params)], 60, (50, 40))


def test_invariant_holds_per_tensor_when_a_set_is_planned_together() -> None:
    gen = torch.Generator().manual_seed(0)
    ef, codec = ErrorFeedback(), make_codec("topk", density=0.01)
    shapes = {"a": (2000,), "b": (30, 100), "c": (10,)}
    fed = {k: torch.zeros(s, dtype=torch.float64) for k, s in shapes.items()}
    sent = {k: torch.zeros(s, dtype=torch.float64) for k, s in shapes.items()}
    for step in range(40):
        tensors = {
            k: torch.randn(s, generator=gen) * (10.0 if k == "a" else 1.0)
            for k, s in shapes.items()
        }
        for key, payload in ef.encode(codec, tensors.items()):
            fed[key] += tensors[key]
            decode_add_payload(payload, sent[key])
            residual = ef.residuals[key].double()
            assert torch.allclose(sent[key] + residual, fed[key], atol=1e-4 * (step + 1) ** 0.5)


def test_invariant_holds_across_codec_switches() -> None:
    codecs = [make_codec(n, **p) for n, p in LOSSY]
    _run(ErrorFeedback(), codecs, 70, (3, 777))


def test_topk_residual_keeps_what_was_not_sent_so_it_is_sent_later() -> None:
    ef, codec = ErrorFeedback(), make_codec("topk", density=0.1)
    g = torch.randn(1000)
    total = torch.zeros(1000)
    decode_add_payload(encode(ef, codec, g)[0], total)
    for _ in range(40):
        decode_add_payload(encode(ef, codec, torch.zeros(1000))[0], total)
    assert torch.allclose(total, g, atol=1e-2)


def test_a_refused_contribution_is_restored_not_lost() -> None:
    ef, codec = ErrorFeedback(), make_codec("topk", density=0.01)
    g1, g2 = torch.randn(500), torch.randn(500)
    _, sent = encode(ef, codec, g1)
    ef.credit("w", sent)  # the round closed before the payload arrived
    payload, _ = encode(ef, codec, g2)
    assert torch.allclose(
        decode_payload(payload, shape=(500,)) + ef.residuals["w"], g1 + g2, atol=1e-5
    )


def test_encode_does_not_modify_the_gradient() -> None:
    for name, params in LOSSY:
        g = torch.randn(2000)
        before = g.clone()
        encode(ErrorFeedback(), make_codec(name, **params), g)
        assert torch.equal(g, before), name


def test_density_warmup_falls_geometrically_to_the_final_density() -> None:
    warmup = DensityWarmup(final=0.001, start=0.25, steps=4)
    densities = [warmup.density(t) for t in range(6)]
    assert densities[0] == 0.25 and densities[4:] == [0.001, 0.001]
    assert all(a > b for a, b in zip(densities, densities[1:4], strict=False))
    with pytest.raises(ValueError, match="final"):
        DensityWarmup(final=0.0)


def test_fp16_after_topk_releases_at_most_one_update_of_the_residual_per_round() -> None:
    ef, topk, fp16 = ErrorFeedback(), make_codec("topk", density=0.01), make_codec("fp16")
    gen = torch.Generator().manual_seed(0)
    fed = torch.zeros(4000, dtype=torch.float64)
    sent = torch.zeros(4000, dtype=torch.float64)
    drift = torch.randn(4000, generator=gen)  # gradients that agree from round to round
    for _ in range(30):  # a far phase: 99 % of every update waits in the residual
        g = drift + torch.randn(4000, generator=gen)
        fed += g
        decode_add_payload(encode(ef, topk, g)[0], sent)
    backlog = float(ef.residuals["w"].norm())
    for _ in range(200):  # the link is near again
        g = drift + torch.randn(4000, generator=gen)
        fed += g
        step = decode_payload(encode(ef, fp16, g)[0], shape=g.shape)
        sent += step
        assert float(step.norm()) <= 2.001 * float(g.norm())  # g and at most |g| of backlog
        assert torch.allclose(sent + ef.residuals["w"].double(), fed, atol=1e-3)
    assert backlog > 10 * float(g.norm()) and float(ef.residuals["w"].norm()) < 1e-2 * backlog


def test_a_residual_no_larger_than_the_update_goes_whole() -> None:
    """FP16's own rounding error: every round sends all of it, as textbook error feedback."""
    residual, g = torch.randn(100) * 1e-3, torch.randn(100)
    assert release_share(g, residual) is None
    ef = ErrorFeedback({"w": residual.clone()})
    _, sent = encode(ef, make_codec("fp32"), g)
    assert torch.equal(sent, g + residual) and not ef.residuals["w"].any()


@pytest.mark.parametrize(("name", "params"), [("topk", {"density": 0.01}), ("ecsgd", {"bits": 2})])
def test_compressing_codecs_take_the_whole_residual(name: str, params: dict) -> None:
    residual, g = torch.randn(100) * 100, torch.randn(100)
    ef = ErrorFeedback({"w": residual.clone()})
    _, sent = encode(ef, make_codec(name, **params), g)
    torch.testing.assert_close(sent + ef.residuals["w"], g + residual)

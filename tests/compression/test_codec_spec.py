"""Codec specs carry the policy's parameters to the agent, or fail with a clear error."""

import pytest
import torch

from skyfed.compression import rounding_seed
from skyfed.compression.spec import codec_from_spec, parse_spec


def test_spec_carries_name_and_parameters():
    spec = 'topk:{"density": 0.001, "values": "fp16"}'
    codec = codec_from_spec(spec)
    assert parse_spec(spec) == ("topk", {"density": 0.001, "values": "fp16"})
    assert (codec.name, codec.density, codec.values) == ("topk", 0.001, "fp16")


def test_plain_name_is_a_spec():
    assert codec_from_spec("fp16").name == "fp16"


@pytest.mark.parametrize(
    "spec",
    [
        "zip",
        "topk:{",
        'topk:{"nope": 1}',
        "topk:[1]",
        "ecsgd:" + "x" * 600,
        'ecsgd:{"clip": 0.5}',
        'ecsgd:{"bits": 3}',
        'ecsgd:{"seed": 1}',
    ],
)
def test_bad_spec_is_a_value_error(spec):
    with pytest.raises(ValueError):
        codec_from_spec(spec)


def test_the_senders_seed_reaches_a_stochastic_codec_and_no_other():
    seed = rounding_seed(0, "aws-1", 3)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    once = codec_from_spec('ecsgd:{"bits": 2}', seed).encode(x)
    assert codec_from_spec('ecsgd:{"bits": 2}', seed).encode(x) == once
    assert codec_from_spec("fp16", seed).name == "fp16"  # deterministic: takes no seed

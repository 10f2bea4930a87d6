"""Codec specs carry the policy's parameters to the agent, or fail with a clear error."""

import pytest

from skyfed.compression.spec import codec_from_spec, format_spec, parse_spec


def test_spec_round_trips_name_and_parameters():
    spec = format_spec("topk", {"density": 0.001, "values": "fp16"})
    codec = codec_from_spec(spec)
    assert parse_spec(spec) == ("topk", {"density": 0.001, "values": "fp16"})
    assert (codec.name, codec.density, codec.values) == ("topk", 0.001, "fp16")


def test_plain_name_is_a_spec():
    assert format_spec("fp16", {}) == "fp16"
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
    ],
)
def test_bad_spec_is_a_value_error(spec):
    with pytest.raises(ValueError):
        codec_from_spec(spec)
